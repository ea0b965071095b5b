#!/usr/bin/env bash
# What the lent GPU machine runs, one call per step (10 minutes a call; the
# machine keeps the build while warm).  Output and reports go under $OUT.
#   tools/on_device.sh build          build and install fxguard into python3
#   tools/on_device.sh tests [ARGS]   the GPU tests (default: -m gpu), from outside the checkout
#   tools/on_device.sh bench MODES    benchmarks/cuda_graph_drafters.py --save, MODES added to one report
#   tools/on_device.sh probe MODES TAG  the same modes under --probe (diagnosis, not saved) into
#                                     $OUT/probe-TAG.json, a line per mode on stdout; DRAFTER_* knobs pass through
#   tools/on_device.sh faults         the CUDA-graph fault harness in this process (-s: each failing
#                                     case printed as it comes), into $OUT/faults.txt
#   tools/on_device.sh diag MODES TAG   the same without --probe (what stock torch <= 2.12 needs in
#                                     one-fast-stock), 3 s windows; the summary shows the first error's traceback
# Each step runs under `timeout` (STEP_TIMEOUT, default 560 s: less where the call also
# builds) so a call ends with what it measured; reports are written after each mode.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
out=${OUT:-/tmp/fxguard-device}
mkdir -p "$out"
step=${1:?build, tests, faults, bench, probe or diag}
shift
case "$step" in
  build)
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$out/gpu.txt"
    python3 -c 'import torch, sys; print(torch.__version__, sys.version.split()[0], torch.cuda.is_available())'
    timeout 300 python3 -m pip install -q --no-build-isolation . 2>&1 | tail -5
    (cd /tmp && python3 -m fxguard doctor 2>&1 | tail -15) | tee "$out/doctor.txt"
    ;;
  tests)
    [ $# -gt 0 ] || set -- -m gpu
    (cd /tmp && timeout 540 python3 -m pytest -q -p no:cacheprovider -rxXs \
       --junitxml="$out/gpu-tests.xml" "$repo/tests" "$@" 2>&1 | tail -40) | tee "$out/gpu-tests.txt"
    ;;
  faults)
    (cd tests/faults && FXGUARD_TEST_FAULTS_HERE=1 timeout "${STEP_TIMEOUT:-560}" python3 -m pytest \
       -q -s -p no:cacheprovider --tb=short test_interrupt_cuda_graphs.py::test_every_line_in_this_process \
       > "$out/faults.txt" 2>&1)
    # the last cases begun, and where every thread waits when one hangs (faulthandler)
    grep -E "^FAILING|lines$|cases in|passed|failed|^case |^Thread|^Current thread|File " "$out/faults.txt" \
      | cut -c1-300 | tail -60
    ;;
  bench)
    # One report over several calls: benchmarks/out/ (ignored) stays on a warm machine,
    # --resume runs only the modes it lacks; the latest saved report has them all.
    modes=${1:?modes, comma-separated}
    part=benchmarks/out/cuda_graph_drafters.json
    mkdir -p benchmarks/out
    timeout "${STEP_TIMEOUT:-560}" python3 benchmarks/cuda_graph_drafters.py --modes "$modes" --seconds "${SECONDS_WINDOW:-15}" \
      --resume "$part" --json "$part" --save 2>&1 | tail -20
    cp "$part" "$out/" 2>/dev/null
    # the newest saved report alone ($OUT brings back 8 files at most)
    saved=$(ls -t benchmarks/results/cuda_graph_drafters/*.json 2>/dev/null | head -1)
    [ -n "$saved" ] && cp "$saved" "$out/saved-$(basename "$saved")"
    ;;
  probe)
    modes=${1:?modes, comma-separated}
    tag=${2:?a tag for the report file}
    timeout "${STEP_TIMEOUT:-560}" python3 benchmarks/cuda_graph_drafters.py --modes "$modes" \
      --seconds "${SECONDS_WINDOW:-8}" --probe --json "$out/probe-$tag.json" > "$out/probe-$tag.log" 2>&1
    python3 benchmarks/_cuda_graph_probe.py "$out/probe-$tag.json"
    ;;
  diag)
    modes=${1:?modes, comma-separated}
    tag=${2:?a tag for the report file}
    timeout "${STEP_TIMEOUT:-560}" python3 benchmarks/cuda_graph_drafters.py --modes "$modes" \
      --seconds "${SECONDS_WINDOW:-3}" --json "$out/diag-$tag.json" > "$out/diag-$tag.log" 2>&1
    python3 benchmarks/_cuda_graph_probe.py "$out/diag-$tag.json"
    ;;
  *) echo "unknown step: $step" >&2; exit 2 ;;
esac
