"""Loading a ~1B-parameter DeepSeek-V3-architecture checkpoint: Corvid against transformers.

Writes (once) a random bf16 checkpoint in 5 GB-style shards (here 500 MB, so there are several)
with transformers' own `save_pretrained`, then times, in fresh processes and alternating:
- Corvid: `corvid model logits --model DIR --ids 1` (load, then one token's forward);
- transformers: `from_pretrained(DIR)` then the same one-token forward.
Both load into fp32 on the CPU (Corvid's CPU dtype), so their memory is comparable. Peak RSS
comes from `/usr/bin/time`; the figure of merit is the ratio of wall times, measured side by
side in one run (absolute times move with the machine's load).

Usage:
    .corvid/venv/bin/python scripts/bench_hf.py [--dir /tmp/corvid-bench/dsv3-1b]
        [--corvid target/release/corvid] [--repeats 3] [--json]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CONFIG = dict(
    vocab_size=32000,
    hidden_size=1024,
    intermediate_size=2816,
    moe_intermediate_size=512,
    num_hidden_layers=12,
    num_attention_heads=16,
    num_key_value_heads=16,
    q_lora_rank=384,
    kv_lora_rank=256,
    qk_nope_head_dim=64,
    qk_rope_head_dim=32,
    v_head_dim=64,
    n_routed_experts=48,
    n_shared_experts=1,
    num_experts_per_tok=6,
    n_group=8,
    topk_group=4,
    routed_scaling_factor=2.5,
    norm_topk_prob=True,
    first_k_dense_replace=1,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
)

TRANSFORMERS_LOAD = """
import sys, torch
from transformers import AutoModelForCausalLM
torch.set_num_threads(int(sys.argv[2]))
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
with torch.no_grad():
    m(torch.tensor([[1]])).logits
"""


def make(path):
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    if os.path.exists(os.path.join(path, "config.json")):
        return
    torch.manual_seed(0)
    cfg = DeepseekV3Config(**CONFIG)
    model = DeepseekV3ForCausalLM(cfg).to(torch.bfloat16)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path, max_shard_size="500MB")


def count_params(path):
    """Elements of every tensor in the folder's safetensors files, read from their headers."""
    from safetensors import safe_open

    total = 0
    for f in os.listdir(path):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(path, f), "pt") as g:
                for k in g.keys():
                    n = 1
                    for d in g.get_slice(k).get_shape():
                        n *= d
                    total += n
    return total


def timed(cmd, env):
    """Wall seconds and peak RSS (MB) of one command."""
    start = time.perf_counter()
    out = subprocess.run(
        ["/usr/bin/time", "-f", "%M"] + cmd, env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    if out.returncode != 0:
        sys.exit(f"{cmd[0]} failed: {out.stderr[-2000:]}")
    rss_kb = int(out.stderr.strip().splitlines()[-1])
    return wall, rss_kb / 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/corvid-bench/dsv3-1b")
    ap.add_argument("--corvid", default="target/release/corvid")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    make(a.dir)
    params = count_params(a.dir)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), HF_HUB_OFFLINE="1",
               HF_HUB_DISABLE_PROGRESS_BARS="1", TRANSFORMERS_VERBOSITY="error")
    corvid, hf = [], []
    for _ in range(a.repeats):
        corvid.append(timed([a.corvid, "model", "logits", "--model", a.dir, "--ids", "1",
                             "--threads", str(a.threads)], env))
        hf.append(timed([sys.executable, "-c", TRANSFORMERS_LOAD, a.dir, str(a.threads)], env))
    c_wall = statistics.median(w for w, _ in corvid)
    h_wall = statistics.median(w for w, _ in hf)
    weights_mb = params * 4 / 2**20
    report = {
        "params": params,
        "disk_dtype": "bf16",
        "loaded_dtype": "fp32",
        "weights_fp32_mb": round(weights_mb, 1),
        "corvid_load_s": [round(w, 2) for w, _ in corvid],
        "transformers_load_s": [round(w, 2) for w, _ in hf],
        "speedup_vs_transformers": round(h_wall / c_wall, 2),
        "corvid_peak_rss_mb": round(max(r for _, r in corvid), 1),
        "transformers_peak_rss_mb": round(max(r for _, r in hf), 1),
        "corvid_rss_over_weights": round(max(r for _, r in corvid) / weights_mb, 2),
        "transformers_rss_over_weights": round(max(r for _, r in hf) / weights_mb, 2),
        "threads": a.threads,
    }
    if a.json:
        print(json.dumps(report))
    else:
        for k, v in report.items():
            print(f"{k:32} {v}")


if __name__ == "__main__":
    main()
