#!/usr/bin/env bash
# The reference run on an offline NVIDIA GPU machine (no network, no nox):
# the whole CUDA platform through `python -m harness` — build, native tests,
# the same tests under compute-sanitizer memcheck, every CUDA comparison group —
# then the pin-ladder benchmark.  Expects the trimmed mirror in mirror/
# (`nox -s source -- export-mirror` on a connected machine) and, where the
# machine lacks them, wheels of the harness's pure-Python needs in .whl/.
#
# Usage: .ci/gpu-evidence.sh OUTDIR     (writes OUTDIR/results.tar.gz and logs)
set -uo pipefail
out=${1:?usage: $0 OUTDIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 HARNESS_CACHE_DIR="$PWD/.harness/cache" PATH="$PATH:/usr/local/cuda/bin"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/harness-site .whl/*.whl || exit 2
    export PYTHONPATH=/tmp/harness-site
fi
export HARNESS_RUN_ID="${HARNESS_RUN_ID:-gpu-$(date -u +%Y%m%dT%H%M%SZ)}"
platform=linux-x86_64-cuda

status=0
python3 -m harness build test --platform "$platform" --sanitize memcheck -j "$(nproc)" 2>&1 | tee "$out/build-test.log"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
python3 -m harness compare-outputs --platform "$platform" 2>&1 | tee "$out/compare.log"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
model=$(python3 -m harness models moe-large | sed -n 's/^moe-large: //p')
python3 -m harness bench --build-dir ".harness/fork/build-$platform" --model "$model" --n-layer 8 \
    --out "results/$HARNESS_RUN_ID/$platform/bench.json" 2>&1 | tee "$out/bench.md"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
tar -czf "$out/results.tar.gz" -C results "$HARNESS_RUN_ID"
echo "done: $HARNESS_RUN_ID (exit $status)"
exit "$status"
