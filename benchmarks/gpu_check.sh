#!/usr/bin/env bash
# Issue 14's GPU check, as one device call: the environment, the tests marked
# `gpu` (the fused kernel compiled by Triton against its reference), the
# `gpu-fused` benchmark preset (fused kernel and scan side by side), the kernel
# at 8 warps, and the README's main job through the CLI. Everything lands under
# $OUT (default benchmarks/results/gpu-DATE). Installs nothing it does not carry:
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

echo "== fused kernel at 8 warps"
for config in "--rounds 200" "--rounds 10 --sweep 64 --sweep-seeds same"; do
  JAXFL_FUSED_WARPS=8 timeout 60 python3 benchmarks/rounds_per_second.py --workload emnist-linear \
    --strategy vmap --loop fused $config 2>>"$OUT/warps8.log" | tail -1 >> "$OUT/warps8.jsonl"
done
cut -c1-400 "$OUT/warps8.jsonl"

echo "== the main job (jaxfl run, defaults)"
start=$(date +%s.%N)
timeout 90 python3 -c "import sys; from jaxfl.cli import main; sys.exit(main(['run', '--out', '/tmp/main-job']))" \
  > "$OUT/main-job.log" 2>&1
status=$?; echo "exit $status wall $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"
tail -6 "$OUT/main-job.log"
