#!/usr/bin/env bash
# The GPU check of the compiled round, as one device call (benchmarks/RESULTS.md, "NVIDIA
# H100, 2026-11-27: where a round's time goes"). In order of importance, each step under its
# own time limit so that a failure or a slow step loses only itself:
#
# 1. `round_profile.py` on the README's quick-start run (label-shift) and emnist-linear with the
#    default local loop, the cohort sampler as it is and as it was before it was vectorized
#    (alternated, in one process), each timed and profiled: kernels, copies, driver calls and
#    device time per phase of a round; Δ-FL on the quick-start run; one round per compiled call
#    against the default;
# 2. the ConvNet; 3. the tests marked `gpu`; 4. a 64-setting sweep; 5. the CLI's quick-start run
#    as a user runs it.
# EXPLORE=1 adds the grid that chose the defaults: every local loop under XLA's default
# flags, with while loops inside CUDA graphs (command buffers with WHILE), with known-count
# loops unrolled there, and with the scan unrolled.
#
# JSON lines land in $OUT (default benchmarks/results/gpu-DATE): profile.jsonl, sweep.jsonl,
# and traces.tar.gz (the raw Perfetto traces with each round's HLO). Installs nothing it does
# not carry: jaxfl imports dp-accounting, which the device image lacks, so carry `.whl`
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
  python3 -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, jax.devices())"
} > "$OUT/environment.txt" 2>&1
cat "$OUT/environment.txt"

TRACES=/tmp/round-traces
profile() {  # profile LIMIT LABEL XLA_FLAGS ARGS...
  local limit=$1 label=$2 flags=$3; shift 3
  echo "== $label: $*"
  XLA_FLAGS="$flags" timeout "$limit" python3 benchmarks/round_profile.py --label "$label" \
    --trace-dir "$TRACES" --out "$OUT/profile.jsonl" "$@" >> "$OUT/profile.log" 2>&1
  echo "exit $?"
}

MAIN="--workload label-shift --rounds 2000 --repeats 5"
LINEAR="--workload emnist-linear --rounds 100 --repeats 5"
AB="--samplers floyd floyd-loop floyd floyd-loop"
profile 120 default "" $MAIN --loops auto $AB
profile 120 default "" $LINEAR --loops auto $AB
profile 60 default "" $MAIN --loops auto --algorithm deltafl
# Rounds per compiled call: the default (10 on a GPU) against one, alternated.
profile 60 one-per-call "" $MAIN --loops auto --rounds-per-call 1 --profile-rounds 0
profile 60 default "" $MAIN --loops auto --profile-rounds 0
profile 60 one-per-call "" $MAIN --loops auto --rounds-per-call 1 --profile-rounds 0
profile 60 one-per-call "" $LINEAR --loops auto --rounds-per-call 1 --profile-rounds 0
profile 90 default "" --workload emnist-cnn --rounds 4 --repeats 2 --profile-rounds 1 --loops auto

echo "== tests marked gpu"
JAX_PLATFORMS=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/training/test_fused.py > "$OUT/gpu-tests.log" 2>&1
echo "exit $?"; tail -3 "$OUT/gpu-tests.log"

echo "== sweep: 64 learning rates of emnist-linear, one compiled round"
timeout 120 python3 benchmarks/rounds_per_second.py --workload emnist-linear --sweep 64 --rounds 10 \
  --repeats 2 > "$OUT/sweep.log" 2>&1
echo "exit $?"; tail -1 "$OUT/sweep.log" | tee "$OUT/sweep.jsonl" | cut -c1-400

echo "== the quick-start run (jaxfl run, defaults)"
start=$(date +%s.%N)
timeout 90 python3 -c "import sys; from jaxfl.cli import main; sys.exit(main(['run', '--out', '/tmp/main-job']))" \
  > "$OUT/main-job.log" 2>&1
status=$?; echo "exit $status wall $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"
tail -4 "$OUT/main-job.log"

if [ "${EXPLORE:-0}" = 1 ]; then
  WHILE_GRAPHS="--xla_gpu_enable_command_buffer=+WHILE"
  UNROLLED_GRAPHS="--xla_gpu_enable_command_buffer=+WHILE --xla_gpu_command_buffer_unroll_loops=true"
  profile 90 default "" $MAIN --loops fused scan while
  profile 90 default "" $LINEAR --loops fused scan while
  profile 70 while-graphs "$WHILE_GRAPHS" $MAIN --loops fused scan while
  profile 70 while-graphs "$WHILE_GRAPHS" $LINEAR --loops fused scan while
  profile 60 unrolled-graphs "$UNROLLED_GRAPHS" $MAIN --loops fused scan
  profile 60 unrolled-graphs "$UNROLLED_GRAPHS" $LINEAR --loops scan
  profile 60 scan-unrolled "" $MAIN --loops scan --scan-unroll 1000
  profile 60 scan-unrolled "" $LINEAR --loops scan --scan-unroll 8
fi

# The ConvNet's trace (tens of thousands of kernels a round) is too large to keep in the archive.
tar -czf "$OUT/traces.tar.gz" --exclude="emnist-cnn-*" -C "$TRACES" . 2>/dev/null
ls -la "$OUT"
grep -E "^(Traceback|[A-Za-z]*Error)" "$OUT/profile.log" | sort | uniq -c | head
python3 - "$OUT/profile.jsonl" <<'PY'
import json, sys
sys.path.insert(0, "benchmarks")
from round_profile import table
print(table([json.loads(line) for line in open(sys.argv[1])]))
PY
