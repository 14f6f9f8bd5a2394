"""Hugging Face checkpoints on the CPU: Corvid against transformers, side by side in one run.

`--what load` (a ~1B-parameter DeepSeek-V3-architecture checkpoint): writes (once) a random
bf16 checkpoint in shards (500 MB, so there are several) with transformers' own
`save_pretrained`, then times, in fresh processes and alternating:
- Corvid: `corvid model logits --model DIR --ids 1` (load, then one token's forward);
- transformers: `from_pretrained(DIR)` then the same one-token forward.
Both load into fp32 on the CPU (Corvid's CPU dtype), so their memory is comparable. Peak RSS
comes from `/usr/bin/time`.

`--what train,decode` (small random Qwen3-MoE and DeepSeek-V3 checkpoints, written once): on
each, `corvid bench hf` and the same work in transformers (default attention, eager PyTorch),
same threads, batch and lengths:
- training tokens/s: forward + causal-LM cross-entropy + backward on random ids, the fastest
  of the timed steps;
- greedy decoding tokens/s at each batch size: random prompts, `generate(do_sample=False)`
  against Corvid's cached batched decode, generated tokens over the whole call.

The figures of merit are the ratios; absolute times move with the machine's load.

Usage:
    .corvid/venv/bin/python scripts/bench_hf.py [--what load,train,decode]
        [--dir /tmp/corvid-bench/dsv3-1b] [--corvid target/release/corvid] [--repeats 3] [--json]
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

# The small configs of the throughput comparison (fp32 on disk).
SMALL = {
    "qwen3_moe": dict(
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=1536,
        moe_intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        num_experts=32,
        num_experts_per_tok=4,
        norm_topk_prob=True,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    ),
    "deepseek_v3": dict(
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=1536,
        moe_intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=8,
        q_lora_rank=192,
        kv_lora_rank=128,
        qk_nope_head_dim=64,
        qk_rope_head_dim=32,
        v_head_dim=64,
        n_routed_experts=32,
        n_shared_experts=1,
        num_experts_per_tok=4,
        n_group=4,
        topk_group=2,
        first_k_dense_replace=1,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    ),
}

TRANSFORMERS_THROUGHPUT = """
import json, sys, time, torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM
d = sys.argv[1]
threads, batch, seq, warmup, steps, prompt, new, repeats = map(int, sys.argv[2:10])
batches = [int(b) for b in sys.argv[10].split(",")]
torch.set_num_threads(threads)
torch.manual_seed(0)
m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
V = m.config.vocab_size
ids = torch.randint(V, (batch, seq + 1))
m.train()
def step():
    t0 = time.perf_counter()
    logits = m(ids[:, :-1]).logits
    loss = F.cross_entropy(logits.reshape(-1, V), ids[:, 1:].reshape(-1))
    m.zero_grad()
    loss.backward()
    return time.perf_counter() - t0
for _ in range(warmup):
    step()
train = batch * seq / min(step() for _ in range(max(steps, 1)))
m.eval()
decode = []
with torch.no_grad():
    for b in batches:
        p = torch.randint(V, (b, prompt))
        def gen(n):
            t0 = time.perf_counter()
            out = m.generate(p, attention_mask=torch.ones_like(p), max_new_tokens=n,
                             min_new_tokens=n, do_sample=False, pad_token_id=0)
            assert out.shape[1] == prompt + n, out.shape
            return time.perf_counter() - t0
        gen(min(new, 4))
        best = min(gen(new) for _ in range(max(repeats, 1)))
        decode.append({"batch": b, "tokens_per_s": b * new / best, "seconds": best})
print(json.dumps({"train": {"tokens_per_s": train}, "decode": {"batches": decode}}))
"""

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


def make_small(family, path):
    """A random fp32 checkpoint of `SMALL[family]`, written once."""
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    if os.path.exists(os.path.join(path, "config.json")):
        return
    torch.manual_seed(0)
    cls = {"qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM),
           "deepseek_v3": (DeepseekV3Config, DeepseekV3ForCausalLM)}[family]
    model = cls[1](cls[0](**SMALL[family]))
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)


def throughput(a, env):
    """Training and decoding tokens/s of Corvid and transformers on each small config."""
    out = {}
    args = dict(threads=a.threads, batch=4, seq=256, warmup=1, steps=3, prompt=16, new=64,
                repeats=2, batches="1,32")
    for family in SMALL:
        path = os.path.join(a.small_dir, family)
        make_small(family, path)
        c = subprocess.run(
            [a.corvid, "bench", "hf", "--model", path, "--json", "--threads", str(args["threads"]),
             "--batch", str(args["batch"]), "--seq", str(args["seq"]),
             "--warmup", str(args["warmup"]), "--steps", str(args["steps"]),
             "--prompt", str(args["prompt"]), "--new-tokens", str(args["new"]),
             "--repeats", str(args["repeats"]), "--decode-batches", args["batches"]],
            env=env, capture_output=True, text=True)
        if c.returncode != 0:
            sys.exit(f"corvid bench hf failed: {c.stderr[-2000:]}")
        corvid = json.loads(c.stdout)
        t = subprocess.run(
            [sys.executable, "-c", TRANSFORMERS_THROUGHPUT, path]
            + [str(args[k]) for k in ("threads", "batch", "seq", "warmup", "steps", "prompt",
                                      "new", "repeats")]
            + [args["batches"]],
            env=env, capture_output=True, text=True)
        if t.returncode != 0:
            sys.exit(f"transformers throughput failed: {t.stderr[-2000:]}")
        hf = json.loads(t.stdout)
        out[family] = {
            "params": corvid["params"],
            "train_tokens_per_s": {"corvid": round(corvid["train"]["tokens_per_s"], 1),
                                   "transformers": round(hf["train"]["tokens_per_s"], 1)},
            "train_speedup": round(corvid["train"]["tokens_per_s"] / hf["train"]["tokens_per_s"], 2),
            "decode": [
                {"batch": cb["batch"],
                 "corvid_tokens_per_s": round(cb["tokens_per_s"], 1),
                 "transformers_tokens_per_s": round(hb["tokens_per_s"], 1),
                 "speedup": round(cb["tokens_per_s"] / hb["tokens_per_s"], 2)}
                for cb, hb in zip(corvid["decode"]["batches"], hf["decode"]["batches"])
            ],
        }
    out["settings"] = args
    return out


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
    ap.add_argument("--what", default="load,train,decode",
                    help="comma-separated: load (the 1B checkpoint), train and decode (small configs)")
    ap.add_argument("--small-dir", default="/tmp/corvid-bench/small")
    a = ap.parse_args()
    what = set(a.what.split(","))
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), HF_HUB_OFFLINE="1",
               HF_HUB_DISABLE_PROGRESS_BARS="1", TRANSFORMERS_VERBOSITY="error")
    report = {}
    if what & {"train", "decode"}:
        report["throughput"] = throughput(a, env)
    if "load" in what:
        report["load"] = load(a, env)
    if a.json:
        print(json.dumps(report))
    else:
        print(json.dumps(report, indent=2))


def load(a, env):
    """The load comparison on the ~1B DeepSeek-V3 checkpoint."""
    make(a.dir)
    params = count_params(a.dir)
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
    return report


if __name__ == "__main__":
    main()
