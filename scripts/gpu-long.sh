#!/usr/bin/env bash
# The long-trajectory check on one GPU: `corvid bench long --device cuda` (bf16 weights, fp32
# routers, blocks checkpointed) for the `gpu-1b` preset (MLA) at 1M tokens, then a
# ~0.95B-parameter Qwen3-MoE shape (GQA 16/4 × 64, 64 experts of width 256 top-8, 12 layers,
# 151,936 ids) at 256K. One JSON line per length in $OUT/long.jsonl (or ./long.jsonl):
# seconds, tokens/s, the device memory the step added, MFU. Each length runs in its own
# process, so one that runs out of memory is reported as failed and the next still runs.
#
# Usage: scripts/gpu-long.sh   (the carried release binary; see scripts/gpu-env.sh)
# Budget: under 8 minutes on one H100, leaving the device budget room for a rerun. At 1M
# tokens gpu-1b's attention is ~27 GFLOP per token forward (`ModelConfig::flops_per_token`),
# ~80 PFLOP with the backward: minutes at the 382 TFLOP/s `scripts/gpu-check.sh` measured for
# its attention; `timeout` stops each run (a 1M step that does not finish is reported so).
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/gpu-env.sh

out_dir=${OUT:-.}
mkdir -p "$out_dir"
if command -v nvidia-smi >/dev/null; then nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >&2 || true; fi

qwen3_moe_1b='hidden_size = 1024
num_hidden_layers = 12
num_attention_heads = 16
attention = { type = "gqa", num_key_value_heads = 4, head_dim = 64, qk_norm = true }
attn_gate = "none"
cross_layer_residual = false
latent_token_shift = false
query_token_shift = false
scoring_func = "softmax"
n_routed_experts = 64
num_experts_per_tok = 8
moe_intermediate_size = 256
n_shared_experts = 0
first_k_dense_replace = 0
expert_dispatch = "grouped_mm"
vocab_size = 151936
tie_word_embeddings = false'

run() {
  local limit=$1
  shift
  set +e
  timeout "$limit" "$bin" bench long --device cuda --checkpoint blocks --json "$@" \
    | tee -a "$out_dir/long.jsonl"
  local rc=${PIPESTATUS[0]}
  set -e
  if [[ $rc == 124 ]]; then
    echo "gpu-long: stopped after ${limit}s: $*" >&2
  elif [[ $rc != 0 ]]; then
    echo "gpu-long: exit $rc: $*" >&2
  fi
  return 0
}

: >"$out_dir/long.jsonl"
run 300 --preset gpu-1b --tokens 1048576
run 120 --preset tiny --overrides "$qwen3_moe_1b" --tokens 262144
