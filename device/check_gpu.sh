#!/usr/bin/env bash
# The prepared run for a GPU node (one GPU, at most 8 minutes): what the CPU lab cannot show, each check bounded,
# its files under $OUT, one summary line each ("check_gpu: <check>: ok|FAIL|skip: ..."), all in $OUT/summary.txt:
#   nvml     the real-NVML tests: the probe's snapshot, and who holds a GPU (processes, memory)
#   reclaim  a CUDA process SIGKILLed mid-kernel: how long until NVML lets go of it and its memory is back
#   fsdp     a 1-GPU FSDP2 trainer with slurm-ft's checkpoint manager, SIGKILLed and resumed: bitwise equal
#   bench    `slurm-ft bench checkpoint --device cuda` at 1 and 4 GB: ours vs dcp.async_save's stagers
#   fr       the flight recorder dump on NCCL (TORCH_FR_BUFFER_SIZE set here)
# Without a GPU it says "no GPU here" and exits 0. Exit 1 when a check failed.
# Usage (from the repository root): OUT=/some/dir device/check_gpu.sh   (default $OUT: /tmp/slurm-ft-gpu-check)
#   CHECKS="fsdp fr"       only these checks
#   CHECK_GPU_DEVICE=cpu   the rehearsal the unit tests run on a CPU host: fsdp and fr over gloo, the rest skipped
set -uo pipefail
out="${OUT:-${1:-/tmp/slurm-ft-gpu-check}}"
mkdir -p "$out"
cd "$(dirname "$0")/.." || exit 1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python="${PYTHON:-python}"
device="${CHECK_GPU_DEVICE:-cuda}"
checks=" ${CHECKS:-nvml reclaim fsdp bench fr} "
export out python

if [ "$device" = cuda ]; then
  if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >"$out/nvidia-smi-L.txt" 2>&1; then
    echo "check_gpu: skip: no GPU here (no working nvidia-smi)" | tee "$out/summary.txt"
    exit 0
  fi
  if ! "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
    echo "check_gpu: skip: no GPU here (torch sees no CUDA device)" | tee "$out/summary.txt"
    exit 0
  fi
fi
: >"$out/summary.txt"
failed=0

# check NAME SECONDS CMD...: run CMD (a program, or a function below) bounded, log to $OUT/NAME.log; its last
# "check_gpu: NAME:" line is the summary.
check() {
  local name=$1 limit=$2 rc summary
  shift 2
  [ "$device" = cuda ] || limit=$((limit * 10))  # the rehearsal runs on a CPU host, maybe a loaded one
  if declare -F "$1" >/dev/null; then
    timeout --kill-after=10 "$limit" bash -c "$(declare -f "$1"); $1" >"$out/$name.log" 2>&1
  else
    timeout --kill-after=10 "$limit" "$@" >"$out/$name.log" 2>&1
  fi
  rc=$?
  summary=$(grep "^check_gpu: $name:" "$out/$name.log" | tail -1)
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    summary="check_gpu: $name: FAIL: did not finish within ${limit}s (see $name.log)"
  elif [ -z "$summary" ]; then
    summary="check_gpu: $name: FAIL: exit $rc without a summary (see $name.log)"
  fi
  case "$summary" in *": FAIL:"*) failed=1 ;; esac
  echo "$summary" | tee -a "$out/summary.txt"
}

nvml_tests() {
  "$python" -c 'import pynvml' 2>/dev/null || { echo "check_gpu: nvml: skip: pynvml (nvidia-ml-py) not installed"; return 0; }
  "$python" -m pytest -q -rs -p no:cacheprovider tests/unit/health/test_nvml.py tests/unit/health/test_nvml_use.py \
    -k real_nvml || { echo "check_gpu: nvml: FAIL: the real-NVML tests failed"; return 1; }
  "$python" -m slurm_ft.health.nvml >"$out/snapshot.json" || { echo "check_gpu: nvml: FAIL: no snapshot"; return 1; }
  "$python" - "$out/snapshot.json" <<'PY'
import json, sys
snap = json.load(open(sys.argv[1]))
state = "ok" if snap["available"] else "FAIL"
print(f"check_gpu: nvml: {state}: {len(snap['gpus'])} GPU(s), driver {snap['driver_version']} {snap['error']}".rstrip())
PY
}

bench() {
  local systems=("ours async" "dcp.async_save thread" "dcp.async_save thread, pinned stager"
                 "dcp.async_save thread, non-blocking copy")
  local args=()
  for s in "${systems[@]}"; do args+=(--system "$s"); done
  "$python" -m slurm_ft.cli bench checkpoint --device cuda --sizes 1024,4096 --repeats 2 --no-memory \
    --dir "${BENCH_DIR:-/tmp/slurm-ft-bench-ckpt}" --out "$out/bench-checkpoint" "${args[@]}" || {
    echo "check_gpu: bench: FAIL: bench checkpoint --device cuda failed"; return 1; }
  "$python" - "$out/bench-checkpoint/checkpoint_peers.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
cells = [f"{r['size_mb'] // 1024:g} GB {r['system']}: stall {r['stall_s']:.3f} s" if r["stall_s"] is not None
         else f"{r['size_mb'] // 1024:g} GB {r['system']}: {r['status']}" for r in rows if r["kind"] != "limit"]
down = [r for r in rows if r["kind"] == "ours" and r["status"] != "ok"]
print(f"check_gpu: bench: {'FAIL' if down else 'ok'}: " + "; ".join(cells))
PY
}

# wanted NAME: the check is asked for; on the CPU rehearsal a GPU-only one says so and is skipped.
wanted() {
  case "$checks" in *" $1 "*) ;; *) return 1 ;; esac
  if [ "$device" != cuda ] && [ "${2:-}" = gpu-only ]; then
    echo "check_gpu: $1: skip: needs a GPU (rehearsal on $device)" | tee -a "$out/summary.txt"
    return 1
  fi
}

wanted nvml gpu-only && check nvml 60 nvml_tests
wanted reclaim gpu-only && check reclaim 75 "$python" -m slurm_ft.bench.gpu_check reclaim --out "$out"
wanted fsdp && check fsdp 100 "$python" -m slurm_ft.bench.gpu_check fsdp --device "$device" --out "$out"
wanted bench gpu-only && check bench 180 bench
wanted fr && check fr 45 env TORCH_FR_BUFFER_SIZE=2000 "$python" -m slurm_ft.bench.gpu_check fr --device "$device" \
  --out "$out"
exit "$failed"
