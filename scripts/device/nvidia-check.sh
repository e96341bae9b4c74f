#!/usr/bin/env bash
# The NVIDIA checks on a real GPU host (scripts/device/nvidia_check.py). On the device
# machine, from the repository root, after scripts/device/prepare.sh here:
#   run(command="scripts/device/nvidia-check.sh", carry=[".devcheck", ".whl",
#       "src/gpuk8s/services/node/api"])
# Results land in $OUT (result.json, raw.json, metrics.txt, cdi.json).
set -uo pipefail
cd "$(dirname "$0")/../.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD/src" PYTHONUNBUFFERED=1
export GPUK8S_DEVICE_TOOLS="$PWD/.devcheck"
OUT="${OUT:-/tmp/gpuk8s-device-out}"
python3 scripts/device/nvidia_check.py --out "$OUT" "$@" 2>&1 | tee "$OUT.log"
cp "$OUT.log" "$OUT/log.txt" 2>/dev/null || true
