#!/usr/bin/env bash
# The main job: set up, build, then `deltagrad train` (arguments are passed on; none trains the
# default GatedDeltaNet on MQAR).  Each stage says what it does.  Run again with no arguments, it
# continues the default run in runs/mqar-gdn (--resume; a finished run reports its result), so
# that the command can always be repeated; `bash scripts/run.sh --overwrite` starts over.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/setup.sh"
bin="$root/build/release/deltagrad"
args=("$@")
if [ $# -eq 0 ] && [ -f runs/mqar-gdn/model.safetensors ]; then
  echo "run: runs/mqar-gdn holds the default run already: continuing it (bash scripts/run.sh --overwrite starts over)" >&2
  args=(--resume runs/mqar-gdn)
fi
echo "run: $bin train ${args[*]}" >&2
exec "$bin" train "${args[@]}"
