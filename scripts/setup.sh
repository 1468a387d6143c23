#!/usr/bin/env bash
# Installs what the build needs on Debian (if missing), then builds.  Sourced by run.sh and test.sh.
#   scripts/setup.sh [scons options...]
set -euo pipefail
need=()
command -v scons >/dev/null 2>&1 || need+=(scons)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
command -v gcc >/dev/null 2>&1 || need+=(gcc libc6-dev)
for p in jemalloc cmocka openblas; do
  if ! pkg-config --exists "$p" 2>/dev/null; then
    case $p in
      jemalloc) need+=(libjemalloc-dev) ;;
      cmocka) need+=(libcmocka-dev) ;;
      openblas) need+=(libopenblas-dev) ;;
    esac
  fi
done
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
scons -Q -j"$jobs" "$@"
