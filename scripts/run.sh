#!/usr/bin/env bash
# The main job: set up, build, then `deltagrad train` (arguments are passed on; none trains the
# default GatedDeltaNet on MQAR).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/setup.sh" >/dev/null
exec "$root/build/release/deltagrad" train "$@"
