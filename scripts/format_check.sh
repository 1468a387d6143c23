#!/usr/bin/env bash
# Checks that every tracked C and CUDA source (.c, .h, .cu, .cuh) is formatted as .clang-format
# says; lists the files that are not and exits 1.  Installs clang-format with apt-get if it is
# missing (Debian 12: clang-format 14, the version .clang-format is written for).
#   bash scripts/format_check.sh            check
#   clang-format -i FILE                    format one file (or: git ls-files ... | xargs clang-format -i)
set -euo pipefail
cd "$(dirname "$0")/.."
cf=""
for c in clang-format-14 clang-format; do
  if command -v "$c" >/dev/null 2>&1; then cf=$c; break; fi
done
if [ -z "$cf" ]; then
  echo "format_check: installing clang-format"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends clang-format >/dev/null
  cf=clang-format
fi
version=$("$cf" --version)
case $version in
  *" 14."*) ;;
  *) echo "format_check: warning: $version; .clang-format is written for clang-format 14, others may differ" >&2 ;;
esac
bad=()
while IFS= read -r -d '' f; do
  "$cf" --dry-run -Werror --style=file "$f" >/dev/null 2>&1 || bad+=("$f")
done < <(git ls-files -z -- '*.c' '*.h' '*.cu' '*.cuh')
if [ ${#bad[@]} -gt 0 ]; then
  echo "format_check: ${#bad[@]} file(s) not formatted as .clang-format says (clang-format -i FILE):"
  printf '  %s\n' "${bad[@]}"
  exit 1
fi
echo "format_check: every tracked .c, .h, .cu, .cuh file is formatted ($version)"
