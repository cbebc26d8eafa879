#!/usr/bin/env bash
# Issue 14's GPU check, as one device call: the environment, the tests marked
# `gpu` (the fused kernel compiled by Triton against its reference), the
# `gpu-fused` benchmark preset (fused kernel and scan side by side), the kernel
# alone (benchmarks/fused_kernel.py: every schedule timed and checked),
# Nsight Compute's counters with NCU=1, and the README's main job through the
# CLI. Everything lands under $OUT (default benchmarks/results/gpu-DATE). Installs nothing it does not carry:
# jaxfl imports dp-accounting, which the device image lacks, so carry `.whl`
# holding its wheel (see the device tool's README).
set -u
OUT=${OUT:-benchmarks/results/gpu-$(date +%F)}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
# pyproject maps kernels/ to jaxfl.kernels; a link does the same for the uninstalled tree.
[ -e jaxfl/kernels ] || ln -s ../kernels jaxfl/kernels
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
{
  date -u; uptime
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  python3 -c "import jax; print('jax', jax.__version__, jax.devices())"
} > "$OUT/environment.txt" 2>&1
cat "$OUT/environment.txt"

echo "== tests marked gpu"
JAX_PLATFORMS=cuda timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/training/test_fused.py > "$OUT/gpu-tests.log" 2>&1
echo "exit $?"; tail -25 "$OUT/gpu-tests.log"

echo "== benchmarks (${PRESET:-gpu-fused})"
timeout "${SUITE_TIMEOUT:-270}" python3 benchmarks/suite.py --preset "${PRESET:-gpu-fused}" \
  --out "$OUT/suite.jsonl" > "$OUT/suite.log" 2>&1
echo "exit $?"; grep -E "^(Traceback|[A-Za-z]*Error)" "$OUT/suite.log" | sort | uniq -c | head
python3 - "$OUT/suite.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    keys = ("rounds_per_s", "speedup", "vmapped_setting_rounds_per_s", "sequential_setting_rounds_per_s",
            "compile_s", "compile_s_sweep", "roofline_fraction", "bound", "error")
    print(d["config"], {k: (round(d[k], 3) if isinstance(d[k], float) else d[k]) for k in keys if k in d})
PY

echo "== the kernel alone, schedule by schedule, each checked against the reference"
timeout "${KERNEL_TIMEOUT:-240}" python3 benchmarks/fused_kernel.py --out "$OUT/kernel.jsonl" > "$OUT/kernel.log" 2>&1
echo "exit $?"; cut -c1-300 "$OUT/kernel.jsonl"

if [ "${NCU:-0}" = 1 ]; then
  # Hardware counters of one launch (occupancy, registers, spills, memory throughput); 60 s was too
  # short for it on 2026-11-26.
  echo "== ncu on the kernel"
  NCU_BIN=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  timeout 240 "$NCU_BIN" --clock-control none --kernel-name regex:fused --launch-count 1 \
    --section LaunchStats --section Occupancy --section SpeedOfLight --section MemoryWorkloadAnalysis \
    python3 benchmarks/fused_kernel.py --quick > "$OUT/ncu.txt" 2>&1
  echo "exit $?"; grep -E "Registers|Local|Duration|Throughput|Occupancy|Hit Rate" "$OUT/ncu.txt" | head -30
fi

echo "== the main job (jaxfl run, defaults)"
start=$(date +%s.%N)
timeout 90 python3 -c "import sys; from jaxfl.cli import main; sys.exit(main(['run', '--out', '/tmp/main-job']))" \
  > "$OUT/main-job.log" 2>&1
status=$?; echo "exit $status wall $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"
tail -6 "$OUT/main-job.log"
