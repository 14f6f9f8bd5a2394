"""Writes a tiny Qwen3 folder that carries Qwen3's released tokenizer and chat template: random
weights (seed 0, fp32) in transformers' Qwen3ForCausalLM at the real vocabulary size (151,936
rows for 151,669 ids), with `tokenizer.json` and `tokenizer_config.json` copied byte for byte
from the released folder (`.corvid/released/qwen3`, see episode/tests/released/README.md).

    released_qwen3_tiny.py --released .corvid/released --out DIR [--hidden 32] [--layers 2]

What a user who brings a Qwen3 checkpoint has, at a size that trains on two CPU cores.
"""

import argparse
import os
import shutil

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--released", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--layers", type=int, default=2)
    a = p.parse_args()
    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=151936, hidden_size=a.hidden, intermediate_size=2 * a.hidden,
        num_hidden_layers=a.layers, num_attention_heads=2, num_key_value_heads=1,
        head_dim=a.hidden // 2, max_position_embeddings=4096, tie_word_embeddings=True,
        rope_theta=1000000.0, rms_norm_eps=1e-6, bos_token_id=151643, eos_token_id=151645,
    )
    model = Qwen3ForCausalLM(cfg).to(torch.float32)
    os.makedirs(a.out, exist_ok=True)
    model.save_pretrained(a.out)
    for f in ["tokenizer.json", "tokenizer_config.json"]:
        shutil.copyfile(os.path.join(a.released, "qwen3", f), os.path.join(a.out, f))


if __name__ == "__main__":
    main()
