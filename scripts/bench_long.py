"""One long trajectory, one forward + backward: Corvid against transformers, side by side.

The model is a small Qwen3-MoE with Qwen3's 151,936-id vocabulary (d 256, 2 layers, 8 experts
top-2, 81.3M parameters, random fp32 weights written once with transformers'
`save_pretrained`). For each length, in a fresh process each, 2 threads:
- transformers, defaults: `model(ids).logits`, causal-LM cross-entropy, `backward()`;
- transformers with `gradient_checkpointing_enable()` and SDPA attention;
- Corvid: `corvid bench long --model DIR` (the RL loss with every term on, the chunked head),
  with `--checkpoint none` and `--checkpoint blocks`.
Each reports seconds, tokens/s and peak RSS growth over the process's RSS before the step.
A process that runs out of memory (an address-space limit of `--limit-gb`, so the machine
survives) is reported as failed. Figures of merit: Corvid's longest length over
transformers', and at a common length the memory and tokens/s ratios.

Usage:
    .corvid/venv/bin/python scripts/bench_long.py [--tokens 4096,8192,16384,32768,65536]
        [--hf-tokens 4096,8192] [--none-tokens 4096,8192,16384] [--dir /tmp/corvid-bench/qwen3-moe-152k]
        [--corvid target/release/corvid] [--json]
"""

import argparse
import json
import os
import subprocess
import sys

CONFIG = dict(
    vocab_size=151936,
    hidden_size=256,
    intermediate_size=768,
    moe_intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    num_experts=8,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    max_position_embeddings=65536,
    tie_word_embeddings=False,
)

TRANSFORMERS_STEP = """
import json, resource, sys, time, torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM
d, t, ckpt, threads, limit_gb = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4]), float(sys.argv[5])
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
torch.set_num_threads(threads)
torch.manual_seed(0)
m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="sdpa")
if ckpt:
    m.gradient_checkpointing_enable()
m.train()
V = m.config.vocab_size
ids = torch.randint(V, (1, t + 1))
resource.setrlimit(resource.RLIMIT_AS, (int(limit_gb * 2**30), int(limit_gb * 2**30)))
open("/proc/self/clear_refs", "w").write("5")
before = status("VmRSS:")
t0 = time.perf_counter()
logits = m(ids[:, :-1]).logits
loss = F.cross_entropy(logits.reshape(-1, V).float(), ids[:, 1:].reshape(-1))
loss.backward()
s = time.perf_counter() - t0
peak = status("VmHWM:")
print(json.dumps({"tokens": t, "seconds": s, "tokens_per_s": t / s,
                  "peak_rss_delta_mb": (peak - before) / 2**20, "peak_rss_mb": peak / 2**20}))
"""


def make(path):
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    if os.path.exists(os.path.join(path, "config.json")):
        return
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**CONFIG))
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)


def params(path):
    import glob
    import math
    from safetensors import safe_open
    n = 0
    for f in glob.glob(os.path.join(path, "*.safetensors")):
        with safe_open(f, "pt") as s:
            n += sum(math.prod(s.get_slice(k).get_shape()) for k in s.keys())
    return n


def run_json(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"failed": f"exit {p.returncode}: {tail[:200]}"}
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    return [json.loads(l) for l in lines] if len(lines) > 1 else json.loads(lines[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="4096,8192,16384,32768,65536")
    ap.add_argument("--hf-tokens", default="4096,8192")
    ap.add_argument("--none-tokens", default="4096,8192,16384",
                    help="lengths for Corvid without checkpointing")
    ap.add_argument("--dir", default="/tmp/corvid-bench/qwen3-moe-152k")
    ap.add_argument("--corvid", default="target/release/corvid")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--limit-gb", type=float, default=20.0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    make(a.dir)
    out = {"config": CONFIG, "parameters": params(a.dir), "threads": a.threads,
           "transformers": {}, "corvid": {}}
    for name, ckpt in [("defaults", "0"), ("checkpointing+sdpa", "1")]:
        rows = []
        for t in a.hf_tokens.split(","):
            r = run_json([sys.executable, "-c", TRANSFORMERS_STEP, a.dir, t, ckpt,
                          str(a.threads), str(a.limit_gb)])
            r.setdefault("tokens", int(t))
            rows.append(r)
            print(f"transformers {name}: {r}", file=sys.stderr)
        out["transformers"][name] = rows
    for ckpt, tokens in [("none", a.none_tokens), ("blocks", a.tokens)]:
        r = run_json([a.corvid, "bench", "long", "--model", a.dir, "--tokens", tokens,
                      "--checkpoint", ckpt, "--threads", str(a.threads), "--json"])
        out["corvid"][ckpt] = r if isinstance(r, list) else [r]
        print(f"corvid {ckpt}: {out['corvid'][ckpt]}", file=sys.stderr)
    # Ratios at each common length: Corvid (blocks) over transformers (defaults).
    ratios = []
    hf = {r["tokens"]: r for r in out["transformers"]["defaults"] if "seconds" in r}
    for r in out["corvid"]["blocks"]:
        h = hf.get(r.get("tokens"))
        if h and r.get("seconds"):
            ratios.append({"tokens": r["tokens"],
                           "memory_ratio": r["peak_rss_delta_mb"] / h["peak_rss_delta_mb"],
                           "speed_ratio": r["tokens_per_s"] / h["tokens_per_s"]})
    out["ratios_blocks_vs_transformers_defaults"] = ratios
    ok = [r for r in out["corvid"]["blocks"] if r.get("seconds")]
    if len(ok) >= 2:
        a0, a1 = ok[0], ok[-1]
        out["corvid_blocks_mb_per_1k_tokens"] = (a1["peak_rss_delta_mb"] - a0["peak_rss_delta_mb"]) / (
            (a1["tokens"] - a0["tokens"]) / 1024)
    print(json.dumps(out, indent=None if a.json else 1))


if __name__ == "__main__":
    main()
