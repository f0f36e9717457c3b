#!/usr/bin/env bash
# Prepared check for a machine with an NVIDIA GPU (not runnable on GPU-less hosts: the test skips there).
# Runs the real-NVML probe test and prints this node's NVML snapshot as JSON.
# Usage (from the repository root): device/check_nvml.sh [output-dir]
set -euo pipefail
out="${1:-${OUT:-/tmp/slurm-ft-nvml-check}}"
mkdir -p "$out"
python -c 'import pynvml' 2>/dev/null || pip install -q "nvidia-ml-py>=12"
python -c 'import slurm_ft' 2>/dev/null || pip install -q -e . --no-deps
nvidia-smi -L | tee "$out/nvidia-smi-L.txt" || true
python -m pytest -q -rs tests/unit/health/test_nvml.py -k real_nvml -p no:cacheprovider 2>&1 | tee "$out/pytest.txt"
grep -q "1 passed" "$out/pytest.txt" || { echo "check_nvml: the real-NVML test did not pass (see above)"; exit 1; }
python -m slurm_ft.health.nvml --xid-wait-ms 100 | tee "$out/snapshot.json"
python - "$out/snapshot.json" <<'PY'
import json, sys
snap = json.load(open(sys.argv[1]))
assert snap["available"], snap["error"]
print(f"check_nvml: ok: {len(snap['gpus'])} GPU(s), driver {snap['driver_version']}")
PY
