"""Writes `model/tests/fixtures/hf/qwen3_moe_chat_tiny/`, the Hugging Face folder the HF demo
(`configs/hf-tiny.toml`) starts from: a tiny random Qwen3-MoE checkpoint with its own byte-level
BPE tokenizer and a ChatML chat template with tools (Hermes `<tool_call>` JSON calls, results as
`<tool_response>` in a user turn, as Qwen3's template lays them out).

The tokenizer is trained with the `tokenizers` library on task text: oracle episodes of Corvid's
built-in families (`corvid tasks sample --chat`, seeds far from any a run trains or evaluates on)
rendered through the template with their tools, so the tool list, call syntax and file markers
become a few tokens each while paths and values stay a handful of short pieces. The model is
`Qwen3MoeForCausalLM` initialised by transformers from a fixed seed.

Run with the pinned transformers of the bootstrapped virtualenv, after `cargo build --release`
(same bytes every time):

    .corvid/venv/bin/python scripts/hf_tiny_fixture.py --corvid target/release/corvid \\
        --out model/tests/fixtures/hf/qwen3_moe_chat_tiny
"""

import argparse
import json
import os
import subprocess
import sys

import tokenizers
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3MoeConfig, Qwen3MoeForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tokenizer_fixtures import CHATML_SPECIALS, CHATML_TOOLS  # noqa: E402

VOCAB_SIZE = 1024
SEED = 0
# (family, levels, episodes per level) of the tokenizer corpus. Seeds start at 1 << 50: a run's
# demonstrations use seeds below 1 << 40, its held-out sets 1 << 40 and 1 << 62 upwards.
CORPUS = [("hops", range(1, 9), 40), ("search", range(1, 4), 10), ("shell", range(1, 4), 10)]
CORPUS_SEED = 1 << 50

# Three layers: with two, SFT on hops 1-2 reached a held-out loss of 0.092 in 1,500 steps (44%
# greedy success at level 1); with three, 0.060 in 550 steps at 1.5x the step time
# (docs/bench/log.md, 2026-12-05 "the Hugging Face demo").
MODEL = dict(
    hidden_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    intermediate_size=256,
    moe_intermediate_size=128,
    num_experts=8,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    max_position_embeddings=4096,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    rms_norm_eps=1e-6,
    initializer_range=0.02,
    tie_word_embeddings=False,
    router_aux_loss_coef=0.001,
)


def episodes(corvid):
    """The corpus conversations: one `{"messages", "tools"}` per oracle episode."""
    out = []
    for family, levels, count in CORPUS:
        for level in levels:
            lines = subprocess.run(
                [corvid, "tasks", "sample", "--family", family, "--level", str(level),
                 "--seed", str(CORPUS_SEED + 1000 * level), "--count", str(count), "--chat"],
                check=True, capture_output=True, text=True).stdout.splitlines()
            assert len(lines) == count, (family, level, len(lines))
            out.extend(json.loads(line) for line in lines)
    return out


def render(template_tokenizer, conversations):
    return [template_tokenizer.apply_chat_template(c["messages"], tools=c["tools"], tokenize=False)
            for c in conversations]


def train_tokenizer(texts, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=CHATML_SPECIALS,
                                  show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def fast_tokenizer(tok):
    return PreTrainedTokenizerFast(tokenizer_object=tok, chat_template=CHATML_TOOLS,
                                   eos_token="<|im_end|>", pad_token="<|endoftext|>")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corvid", default="target/release/corvid")
    ap.add_argument("--out", default="model/tests/fixtures/hf/qwen3_moe_chat_tiny")
    a = ap.parse_args()

    conversations = episodes(a.corvid)
    # The template only needs a tokenizer to be called through; any one renders the same text.
    texts = render(fast_tokenizer(train_tokenizer(["a"], 300)), conversations)
    fast = fast_tokenizer(train_tokenizer(texts, VOCAB_SIZE))
    os.makedirs(a.out, exist_ok=True)
    fast.save_pretrained(a.out)
    fast = transformers.AutoTokenizer.from_pretrained(a.out)
    assert render(fast, conversations) == texts
    lengths = [len(fast(t, add_special_tokens=False)["input_ids"]) for t in texts]

    vocab = len(fast)
    config = Qwen3MoeConfig(vocab_size=vocab, eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
                            pad_token_id=fast.convert_tokens_to_ids("<|endoftext|>"),
                            bos_token_id=None, **MODEL)
    torch.manual_seed(SEED)
    model = Qwen3MoeForCausalLM(config).eval()
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    model.save_pretrained(a.out)

    by_family = {}
    i = 0
    for family, levels, count in CORPUS:
        for level in levels:
            chunk = lengths[i:i + count]
            i += count
            by_family.setdefault(family, {})[str(level)] = dict(mean_tokens=round(sum(chunk) / count),
                                                               max_tokens=max(chunk))
    meta = dict(
        what="the HF demo's starting point: a tiny random Qwen3-MoE with a BPE tokenizer trained on "
        "task text and a ChatML template with tools",
        transformers=transformers.__version__, tokenizers=tokenizers.__version__,
        torch=torch.__version__, seed=SEED, vocab_size=vocab,
        parameters=sum(p.numel() for p in model.parameters()),
        corpus=dict(episodes=len(texts), seed_base=CORPUS_SEED,
                    families={f: dict(levels=[min(l), max(l)], per_level=n) for f, l, n in CORPUS}),
        episode_tokens=by_family,
    )
    with open(os.path.join(a.out, "meta.json"), "w") as fh:
        json.dump(meta, fh, indent=1, sort_keys=True)
        fh.write("\n")
    print(json.dumps(meta, indent=1, sort_keys=True), file=sys.stderr)


if __name__ == "__main__":
    main()
