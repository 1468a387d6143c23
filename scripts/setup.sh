#!/usr/bin/env bash
# Installs what the build needs on Debian (if missing), then builds, saying what it does at each
# stage (on stderr): the dependency check, the install if one is needed, then the build with one
# line per file compiled.  Called by run.sh and test.sh.
#   scripts/setup.sh [scons options...]
set -euo pipefail
say() { echo "setup: $*" >&2; }
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
  say "installing ${need[*]} with apt-get (a minute or two)"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  say "installed"
else
  say "dependencies present (scons, pkg-config, gcc, jemalloc, cmocka, openblas)"
fi
cd "$(dirname "$0")/.."
jobs=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || echo 2)
say "building with scons -j$jobs $* (the first build compiles every file: minutes on a small machine; later ones only what changed)"
start=$(date +%s)
scons -Q -j"$jobs" progress=1 "$@"
say "build done ($(($(date +%s) - start)) s)"
