#!/usr/bin/env python3
"""Hugging Face parity fixtures: tiny random DeepSeek-V3, Qwen3-MoE and Qwen3 checkpoints written
by `transformers` itself, with the outputs a Rust test compares against.

    .corvid/venv/bin/python scripts/hf_fixtures.py [--out model/tests/fixtures/hf] [--only NAME ...]

Every run regenerates the same bytes: fixed seeds, one CPU thread, deterministic algorithms,
fp32, eager attention and the eager (per-expert loop) MoE implementation. For each variant it writes
OUT/<variant>/ with what `save_pretrained` writes (config.json, generation_config.json,
model.safetensors or shards plus model.safetensors.index.json; experts in the per-expert hub
layout `mlp.experts.{j}.{gate,up,down}_proj.weight`), then

  expected.safetensors  input_ids [2,16] i64, logits [2,16,V] f32 (eval, no grad);
                        prompt_ids [8] i64, greedy_ids [32] i64 (the 32 new tokens of greedy
                        generate, eos disabled); train_input_ids [2,12] i64, train_labels [2,12]
                        i64 (-100 where ignored), train_loss [] f32 (transformers' shifted mean
                        cross-entropy, train mode), train_grad_norm [] f32 (2-norm over every
                        parameter's gradient after loss.backward(), a tied weight counted once);
  meta.json             what the variant exercises, versions, seed and the settings used.

Expected outputs are always computed from the weights as a reader of the folder gets them: the
fp32 variants and deepseek_v3_bf16 from `from_pretrained(folder, dtype=float32)`,
deepseek_v3_fp8 from its dequantised weights (`w_fp8.float() * scale_inv` per 128x128 block)
loaded through transformers. Each folder is then checked: it loads back and reproduces `logits`
to 1e-5, and `greedy_ids` equal a plain argmax loop without cache.
"""
import argparse
import json
import math
import os
import shutil
import sys
import tempfile

import torch

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)

import transformers  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import (  # noqa: E402
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    GenerationConfig,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

VOCAB = 128
# Linear and embedding init std. 0.02 (the library default) leaves logits near zero and every
# token routed alike at this width; 0.2 gives logits of std ~1 and routing that varies by token.
INIT_STD = 0.2
NORM_SPREAD = 0.5  # every RMSNorm weight is 1 + U(-0.5, 0.5), never exactly 1
BIAS_STD = 0.1  # e_score_correction_bias ~ N(0, 0.1); sigmoid scores here spread ~0.15 around 0.5
FP8_MAX = 448.0  # largest finite float8_e4m3fn
FP8_BLOCK = 128
FP8_QUANT_CONFIG = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [FP8_BLOCK, FP8_BLOCK],
}
TRAIN_IGNORED = [(0, 2), (0, 7), (1, 1), (1, 5), (1, 6)]  # (row, position) labels set to -100
TRAIN_SETTINGS = {
    "mode": "model.train()",
    "attention_dropout": 0.0,
    "output_router_logits": False,
    "aux_loss_in_loss": False,
    "router_jitter": "none (neither family has one)",
    "loss": "transformers ForCausalLMLoss: labels shifted left, mean cross-entropy over labels != -100",
    "grad_norm": "sqrt(sum over model.parameters() of grad^2); tied embed/lm_head is one parameter",
}
GEN_SETTINGS = {
    "call": "model.generation_config = GenerationConfig(eos_token_id=None, bos_token_id=None, "
    "pad_token_id=None); model.generate(prompt_ids[None], attention_mask=ones, "
    "generation_config=GenerationConfig(do_sample=False, max_new_tokens=32, min_new_tokens=32))",
    "eos": "none during generation (generate() would otherwise take eos from the model's "
    "generation_config and mask it for min_new_tokens), so no token is masked and generation "
    "cannot stop early; config.json and generation_config.json still carry the family's bos/eos",
    "check": "greedy_ids equal a full-recompute argmax loop (no cache)",
}

DSV3_BASE = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=40,
    moe_intermediate_size=16,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    q_lora_rank=24,
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
    n_routed_experts=8,
    n_shared_experts=1,
    num_experts_per_tok=2,
    n_group=4,
    topk_group=2,
    routed_scaling_factor=2.5,
    norm_topk_prob=True,
    first_k_dense_replace=1,
    max_position_embeddings=64,
    rope_interleave=True,
    tie_word_embeddings=False,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
)

QWEN3_MOE_BASE = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=16,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_experts=8,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[1],
    max_position_embeddings=64,
    tie_word_embeddings=False,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
)

QWEN3_BASE = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=64,
    tie_word_embeddings=False,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
)


def merged(base, **changes):
    out = dict(base)
    out.update(changes)
    return out


# Seeds are picked (among a handful tried) so that the greedy continuation is not a loop of one
# or two tokens (>= 10 distinct ids) and its smallest top-1/top-2 logit gap is >= 5e-3, far above
# fp32 rounding; meta.json records both as stats.greedy_*.
VARIANTS = {
    "deepseek_v3_qlora": dict(
        family="deepseek_v3",
        seed=1002,
        description="DeepSeek-V3 MLA with q_lora_rank, interleaved rope, 1 dense then 2 MoE layers, "
        "group-limited (4 groups, top-2) sigmoid routing with correction bias, normalised top-k x 2.5, "
        "shared expert, untied lm_head",
        config=DSV3_BASE,
    ),
    "deepseek_v3_plain_yarn": dict(
        family="deepseek_v3",
        seed=1014,
        description="DeepSeek-V3 without q_lora (q_proj), YaRN rope (factor 4, mscale_all_dim: softmax "
        "scale x mscale^2), 6 experts in one group, un-normalised top-k x 2.5, all layers MoE, tied "
        "embeddings, sharded safetensors with an index",
        config=merged(
            DSV3_BASE,
            q_lora_rank=None,
            n_routed_experts=6,
            n_group=1,
            topk_group=1,
            norm_topk_prob=False,
            first_k_dense_replace=0,
            tie_word_embeddings=True,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 16,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
            },
        ),
        max_shard_size="100KB",
    ),
    "deepseek_v3_bf16": dict(
        family="deepseek_v3",
        seed=1024,
        description="deepseek_v3_qlora's shapes saved by transformers in bf16 (router gate.weight and "
        "e_score_correction_bias kept fp32 by _keep_in_fp32_modules_strict); expected outputs in fp32 "
        "from the bf16-rounded weights",
        config=DSV3_BASE,
        disk_dtype="bfloat16",
    ),
    "deepseek_v3_fp8": dict(
        family="deepseek_v3",
        seed=1031,
        description="deepseek_v3_qlora's shapes (dense intermediate 160, so some weights span 2 ragged "
        "128x128 blocks) with every attention/MLP/expert projection stored as float8_e4m3fn plus "
        "<name>_scale_inv f32 blocks, as DeepSeek-V3's hub checkpoints; expected outputs from the "
        "dequantised weights",
        config=merged(DSV3_BASE, intermediate_size=160),
        fp8=True,
    ),
    "qwen3_moe": dict(
        family="qwen3_moe",
        seed=2025,
        description="Qwen3-MoE: GQA 4/2 heads with head_dim 16 != hidden/heads, per-head q/k RMSNorm, "
        "softmax top-2 of 8 renormalised, layer 1 dense via mlp_only_layers, untied",
        config=QWEN3_MOE_BASE,
    ),
    "qwen3_moe_sparse_step": dict(
        family="qwen3_moe",
        seed=2011,
        description="Qwen3-MoE with decoder_sparse_step 2 (only layer 1 is MoE), un-normalised softmax "
        "top-2, MQA (1 kv head), tied embeddings, rope_theta 1e6",
        config=merged(
            QWEN3_MOE_BASE,
            norm_topk_prob=False,
            decoder_sparse_step=2,
            mlp_only_layers=[],
            num_key_value_heads=1,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        ),
    ),
    "qwen3_moe_byte_vocab": dict(
        family="qwen3_moe",
        seed=2031,
        description="qwen3_moe's shapes sized for a Corvid run to start from (`[model] hf`): the byte "
        "tokenizer's 264 ids and 1024 positions",
        config=merged(QWEN3_MOE_BASE, vocab_size=264, max_position_embeddings=1024),
    ),
    "qwen3": dict(
        family="qwen3",
        seed=3008,
        description="dense Qwen3: GQA 4/2 heads with head_dim 16 != hidden/heads, per-head q/k RMSNorm "
        "before rope, untied",
        config=QWEN3_BASE,
    ),
    "qwen3_tied_yarn": dict(
        family="qwen3",
        seed=3020,
        description="dense Qwen3 with YaRN rope (factor 2, original 32; cos/sin scaled by "
        "0.1 ln 2 + 1, partial ramp), tied embeddings, hidden 64 = heads x head_dim",
        config=merged(
            QWEN3_BASE,
            hidden_size=64,
            intermediate_size=96,
            tie_word_embeddings=True,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 2.0,
                "original_max_position_embeddings": 32,
            },
        ),
    ),
}

FAMILIES = {
    "deepseek_v3": (DeepseekV3Config, DeepseekV3ForCausalLM),
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
}


def build_config(spec):
    config_cls, _ = FAMILIES[spec["family"]]
    kwargs = json.loads(json.dumps(spec["config"]))  # a deep copy; configs mutate their dicts
    kwargs["initializer_range"] = INIT_STD
    kwargs["attn_implementation"] = "eager"
    if spec["family"] != "qwen3":
        kwargs["experts_implementation"] = "eager"
    return config_cls(**kwargs)


def load(spec, folder, dtype=torch.float32):
    _, model_cls = FAMILIES[spec["family"]]
    kwargs = dict(dtype=dtype, attn_implementation="eager")
    if spec["family"] != "qwen3":
        kwargs["experts_implementation"] = "eager"
    return model_cls.from_pretrained(folder, **kwargs).eval()


@torch.no_grad()
def randomise_norms_and_bias(model, gen):
    """RMSNorm weights at 1 and a correction bias at 0 would hide a missing multiply or add."""
    for name, module in model.named_modules():
        if type(module).__name__.endswith("RMSNorm"):
            w = module.weight
            w.copy_(1.0 + (torch.rand(w.shape, generator=gen) * 2.0 - 1.0) * NORM_SPREAD)
        if hasattr(module, "e_score_correction_bias"):
            b = module.e_score_correction_bias
            b.copy_(torch.randn(b.shape, generator=gen) * BIAS_STD)


def fp8_targets(state):
    """The weights DeepSeek-V3's hub checkpoints store in fp8: every 2-D projection of attention,
    the dense MLPs, the shared and the routed experts. Not embed_tokens, lm_head, norms, nor the
    router (mlp.gate.weight, e_score_correction_bias)."""
    out = []
    for name, t in state.items():
        if t.dim() != 2 or not name.endswith("_proj.weight") and not name.endswith("_mqa.weight"):
            continue
        if ".self_attn." in name or ".mlp." in name:
            out.append(name)
    return sorted(out)


def quantise_fp8(w):
    """Block-wise float8_e4m3fn with scale_inv = amax/448 per 128x128 block (ragged at the edges),
    so each block's largest weight maps to +-448. Returns (w_fp8, scale_inv, dequantised)."""
    rows, cols = w.shape
    br, bc = math.ceil(rows / FP8_BLOCK), math.ceil(cols / FP8_BLOCK)
    scale_inv = torch.empty(br, bc, dtype=torch.float32)
    for i in range(br):
        for j in range(bc):
            block = w[i * FP8_BLOCK:(i + 1) * FP8_BLOCK, j * FP8_BLOCK:(j + 1) * FP8_BLOCK]
            scale_inv[i, j] = block.abs().max().clamp(min=1e-12) / FP8_MAX
    full = scale_inv.repeat_interleave(FP8_BLOCK, 0)[:rows].repeat_interleave(FP8_BLOCK, 1)[:, :cols]
    w_fp8 = (w.float() / full).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return w_fp8, scale_inv, dequantise_fp8(w_fp8, scale_inv)


def dequantise_fp8(w_fp8, scale_inv):
    """DeepSeek's inference/fp8_cast_bf16.py weight_dequant, in fp32: w_fp8.float() * scale_inv
    broadcast over each 128x128 block."""
    rows, cols = w_fp8.shape
    full = scale_inv.repeat_interleave(FP8_BLOCK, 0)[:rows].repeat_interleave(FP8_BLOCK, 1)[:, :cols]
    return w_fp8.to(torch.float32) * full


def read_state(folder):
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        files = sorted(set(json.load(open(index))["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    state = {}
    for f in files:
        state.update(load_file(os.path.join(folder, f)))
    return state


def write_fp8_folder(spec, src, dst, seed):
    """src: a fp32 save_pretrained folder. Writes dst with the fp8 checkpoint (fp8 weights plus
    scale_inv; everything else fp32) and a twin folder of the dequantised fp32 weights, which is
    what the expected outputs are computed from. Returns (twin folder, fp8 tensor names)."""
    state = read_state(src)
    targets = fp8_targets(state)
    fp8_state, deq_state = {}, {}
    for name, t in state.items():
        if name in targets:
            w_fp8, scale_inv, deq = quantise_fp8(t)
            fp8_state[name] = w_fp8
            fp8_state[name + "_scale_inv"] = scale_inv
            deq_state[name] = deq
        else:
            fp8_state[name] = t
            deq_state[name] = t
    os.makedirs(dst, exist_ok=True)
    for f in ("config.json", "generation_config.json"):
        shutil.copy(os.path.join(src, f), os.path.join(dst, f))
    save_file(fp8_state, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    cfg = json.load(open(os.path.join(dst, "config.json")))
    cfg["quantization_config"] = FP8_QUANT_CONFIG
    with open(os.path.join(dst, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2, sort_keys=True)
        fh.write("\n")
    twin = src + "-dequantised"
    shutil.copytree(src, twin)
    os.remove(os.path.join(twin, "model.safetensors"))
    save_file(deq_state, os.path.join(twin, "model.safetensors"), metadata={"format": "pt"})
    return twin, targets


def greedy_reference(model, prompt, steps):
    """Argmax loop recomputing the whole sequence each step; also the smallest top-1/top-2 gap."""
    ids = prompt[None].clone()
    margin = float("inf")
    with torch.no_grad():
        for _ in range(steps):
            last = model(ids).logits[0, -1]
            top = torch.topk(last, 2).values
            margin = min(margin, float(top[0] - top[1]))
            ids = torch.cat([ids, last.argmax().view(1, 1)], dim=1)
    return ids[0, prompt.numel():], margin


def compute_expected(model, vocab, seed):
    gen = torch.Generator().manual_seed(seed * 7 + 1)
    input_ids = torch.randint(0, vocab, (2, 16), generator=gen)
    prompt_ids = torch.randint(0, vocab, (8,), generator=gen)
    train_input_ids = torch.randint(0, vocab, (2, 12), generator=gen)
    train_labels = train_input_ids.clone()
    for r, c in TRAIN_IGNORED:
        train_labels[r, c] = -100

    model.eval()
    with torch.no_grad():
        logits = model(input_ids).logits.float()
        # generate() fills every None in the config it is given from model.generation_config, so
        # eos_token_id=None alone would not stop the eos from config.json being masked for
        # min_new_tokens: clear it on the model for the call.
        saved = model.generation_config
        model.generation_config = GenerationConfig(eos_token_id=None, bos_token_id=None, pad_token_id=None)
        gc = GenerationConfig(do_sample=False, max_new_tokens=32, min_new_tokens=32)
        out = model.generate(
            prompt_ids[None], attention_mask=torch.ones(1, prompt_ids.numel(), dtype=torch.int64), generation_config=gc
        )
        model.generation_config = saved
    greedy_ids = out[0, prompt_ids.numel():].clone()
    assert greedy_ids.numel() == 32, greedy_ids.shape
    ref_ids, margin = greedy_reference(model, prompt_ids, 32)
    assert torch.equal(ref_ids, greedy_ids), (ref_ids, greedy_ids)

    model.train()
    model.zero_grad(set_to_none=True)
    out = model(train_input_ids, labels=train_labels, output_router_logits=False)
    loss = out.loss
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    grad_norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
    model.zero_grad(set_to_none=True)
    model.eval()

    expected = {
        "input_ids": input_ids.to(torch.int64).contiguous(),
        "logits": logits.contiguous(),
        "prompt_ids": prompt_ids.to(torch.int64).contiguous(),
        "greedy_ids": greedy_ids.to(torch.int64).contiguous(),
        "train_input_ids": train_input_ids.to(torch.int64).contiguous(),
        "train_labels": train_labels.to(torch.int64).contiguous(),
        "train_loss": loss.detach().float().reshape(()).contiguous(),
        "train_grad_norm": grad_norm.detach().float().reshape(()).contiguous(),
    }
    stats = {
        "greedy_min_top2_margin": margin,
        "greedy_distinct_tokens": int(greedy_ids.unique().numel()),
        "logits_std": float(logits.std()),
    }
    return expected, stats


def routing_stats(model, input_ids):
    """How much the routing varies: distinct expert sets per MoE layer over the 32 tokens, and
    (DeepSeek) how many tokens' selection the correction bias changes."""
    stats = {}
    captured = {}
    hooks = []
    for name, module in model.named_modules():
        if type(module).__name__.endswith(("TopkRouter", "TopKRouter")):
            hooks.append(module.register_forward_hook(
                lambda m, i, o, name=name: captured.__setitem__(name, (m, i[0].detach(), o))))
    with torch.no_grad():
        model(input_ids)
    for h in hooks:
        h.remove()
    for name, (m, x, o) in sorted(captured.items()):
        idx = o[2].sort(dim=-1).values
        entry = {"distinct_expert_sets": len({tuple(r.tolist()) for r in idx})}
        if hasattr(m, "e_score_correction_bias"):
            bias = m.e_score_correction_bias.clone()
            m.e_score_correction_bias.zero_()
            with torch.no_grad():
                unbiased = m(x)[2].sort(dim=-1).values
            m.e_score_correction_bias.copy_(bias)
            entry["tokens_whose_selection_the_bias_changes"] = int((unbiased != idx).any(-1).sum())
        stats[name.replace("model.layers.", "layer ").replace(".mlp.gate", "")] = entry
    return stats


def folder_files(folder):
    return sorted(f for f in os.listdir(folder) if not f.startswith("."))


def describe_layers(config, family):
    if family == "deepseek_v3":
        return ["dense" if i < config.first_k_dense_replace else "moe" for i in range(config.num_hidden_layers)]
    if family == "qwen3_moe":
        return [
            "moe"
            if (i not in config.mlp_only_layers) and config.num_experts > 0 and (i + 1) % config.decoder_sparse_step == 0
            else "dense"
            for i in range(config.num_hidden_layers)
        ]
    return ["dense"] * config.num_hidden_layers


def make_variant(name, spec, out_root, tmp_root):
    seed = spec["seed"]
    dst = os.path.join(out_root, name)
    if os.path.exists(dst):
        shutil.rmtree(dst)
    torch.manual_seed(seed)
    config = build_config(spec)
    _, model_cls = FAMILIES[spec["family"]]
    model = model_cls(config).float().eval()
    randomise_norms_and_bias(model, torch.Generator().manual_seed(seed * 7))

    fp8_names = None
    if spec.get("fp8"):
        src = os.path.join(tmp_root, name + "-fp32")
        model.save_pretrained(src)
        twin, fp8_names = write_fp8_folder(spec, src, dst, seed)
        ref = load(spec, twin)
    elif spec.get("disk_dtype") == "bfloat16":
        src = os.path.join(tmp_root, name + "-fp32")
        model.save_pretrained(src)
        # Loading with dtype=bf16 is how transformers makes a bf16 model: it rounds every weight
        # except the _keep_in_fp32_modules_strict ones (router gate.weight, e_score_correction_bias).
        load(spec, src, dtype=torch.bfloat16).save_pretrained(dst)
        ref = load(spec, dst)
    else:
        kwargs = {}
        if "max_shard_size" in spec:
            kwargs["max_shard_size"] = spec["max_shard_size"]
        model.save_pretrained(dst, **kwargs)
        ref = load(spec, dst)

    expected, stats = compute_expected(ref, config.vocab_size, seed)
    save_file(expected, os.path.join(dst, "expected.safetensors"), metadata={"format": "pt"})

    disk_dtypes = {}
    for f in folder_files(dst):
        if f.endswith(".safetensors") and f != "expected.safetensors":
            with safe_open(os.path.join(dst, f), "pt") as fh:
                for k in fh.keys():
                    dt = str(fh.get_slice(k).get_dtype())
                    disk_dtypes[dt] = disk_dtypes.get(dt, 0) + 1
    meta = {
        "variant": name,
        "description": spec["description"],
        "architecture": model_cls.__name__,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__.split("+")[0],
        "seed": seed,
        "generated_by": "scripts/hf_fixtures.py",
        "init": {
            "initializer_range": INIT_STD,
            "rmsnorm_weights": f"1 + U(-{NORM_SPREAD}, {NORM_SPREAD})",
            "e_score_correction_bias": f"N(0, {BIAS_STD})" if spec["family"] == "deepseek_v3" else None,
        },
        "attn_implementation": "eager",
        "experts_implementation": "eager" if spec["family"] != "qwen3" else None,
        "compute_dtype": "float32",
        "layers": describe_layers(config, spec["family"]),
        "files": folder_files(dst) + ["meta.json"],
        "tensor_dtypes_on_disk": disk_dtypes,
        "expected_from": (
            "dequantised fp8 weights (w_fp8.float() * scale_inv per 128x128 block), loaded as fp32"
            if spec.get("fp8")
            else "from_pretrained(folder, dtype=float32)"
        ),
        "generation": GEN_SETTINGS,
        "train": dict(TRAIN_SETTINGS, ignored_label_positions=TRAIN_IGNORED),
        "stats": dict(stats, routing=routing_stats(ref, expected["input_ids"]) if spec["family"] != "qwen3" else None),
    }
    if fp8_names is not None:
        meta["fp8"] = {
            "quantization_config": FP8_QUANT_CONFIG,
            "scale": "scale_inv = amax(|w|) / 448 per 128x128 block (ragged edge blocks use their own amax)",
            "quantised_weights": fp8_names,
            "not_quantised": "embed_tokens, lm_head, all norms, mlp.gate.weight, e_score_correction_bias (fp32 on disk)",
        }
    with open(os.path.join(dst, "meta.json"), "w") as fh:
        json.dump(meta, fh, indent=2)
        fh.write("\n")
    return ref


def check_variant(name, spec, out_root, tmp_root):
    """Reload the folder as a reader would and compare with expected.safetensors."""
    dst = os.path.join(out_root, name)
    expected = load_file(os.path.join(dst, "expected.safetensors"))
    if spec.get("fp8"):
        state = read_state(dst)
        deq = {}
        for k, t in state.items():
            if k.endswith("_scale_inv"):
                continue
            if k + "_scale_inv" in state:
                assert t.dtype == torch.float8_e4m3fn, (k, t.dtype)
                deq[k] = dequantise_fp8(t, state[k + "_scale_inv"])
            else:
                deq[k] = t
        twin = os.path.join(tmp_root, name + "-check")
        os.makedirs(twin, exist_ok=True)
        cfg = json.load(open(os.path.join(dst, "config.json")))
        cfg.pop("quantization_config")
        with open(os.path.join(twin, "config.json"), "w") as fh:
            json.dump(cfg, fh)
        save_file(deq, os.path.join(twin, "model.safetensors"), metadata={"format": "pt"})
        model = load(spec, twin)
    else:
        model = load(spec, dst)
    with torch.no_grad():
        logits = model(expected["input_ids"]).logits.float()
    diff = float((logits - expected["logits"]).abs().max())
    assert diff <= 1e-5, f"{name}: max |dlogits| {diff}"
    ids, _ = greedy_reference(model, expected["prompt_ids"], 32)
    assert torch.equal(ids, expected["greedy_ids"]), f"{name}: greedy ids differ"
    # The loss by hand (predict position t+1 from t; mean over targets != -100) and the gradient
    # norm of the reloaded model.
    model.train()
    logits = model(expected["train_input_ids"]).logits.float()
    targets = expected["train_labels"][:, 1:]
    loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100
    )
    loss.backward()
    norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters() if p.grad is not None))
    loss = loss.detach()
    assert abs(float(loss) - float(expected["train_loss"])) <= 1e-5, (name, float(loss), float(expected["train_loss"]))
    rel = abs(float(norm) - float(expected["train_grad_norm"])) / float(norm)
    assert rel <= 1e-5, (name, float(norm), float(expected["train_grad_norm"]))
    return diff


README = """# Hugging Face parity fixtures

Tiny random checkpoints written by `transformers` {tv} (torch {torchv}, CPU, fp32, eager attention and
eager MoE) and the outputs the Rust parity tests compare against. Regenerate all of them (same bytes
every time) with

    .corvid/venv/bin/python scripts/hf_fixtures.py --out model/tests/fixtures/hf

(`scripts/bootstrap.sh` installs the pinned transformers into that virtualenv.)

Each `<variant>/` folder holds what `save_pretrained` writes (`config.json`, `generation_config.json`,
`model.safetensors`, or shards plus `model.safetensors.index.json`; experts in the per-expert hub
layout `mlp.experts.{{j}}.{{gate,up,down}}_proj.weight`), `meta.json` (what the variant exercises,
versions, seed, settings, routing statistics) and `expected.safetensors`:

| tensor | dtype, shape | what |
|---|---|---|
| `input_ids` | i64 [2, 16] | random ids in 0..vocab |
| `logits` | f32 [2, 16, vocab] | `model(input_ids).logits`, eval mode |
| `prompt_ids` | i64 [8] | random prompt |
| `greedy_ids` | i64 [32] | the 32 new ids of greedy `generate` (eos disabled, so none is masked) |
| `train_input_ids` | i64 [2, 12] | random ids |
| `train_labels` | i64 [2, 12] | `train_input_ids` with a few positions set to -100 |
| `train_loss` | f32 [] | `model(train_input_ids, labels=train_labels).loss` in train mode: labels shifted left, mean over non-ignored targets, no aux loss |
| `train_grad_norm` | f32 [] | 2-norm over all parameter gradients after `loss.backward()` (a tied weight once) |

Expected outputs come from the weights as stored: `deepseek_v3_bf16` from its bf16 weights read back
as fp32, `deepseek_v3_fp8` from `w_fp8.float() * scale_inv` per 128x128 block.

What a loader meets in these files:

- Tied variants have no `lm_head.weight`; the head is `model.embed_tokens.weight`.
- Qwen3-MoE's `config.json` names the expert count `num_local_experts` (transformers 5 writes the
  attribute behind its `num_experts` alias); hub checkpoints say `num_experts`. Accept both.
- DeepSeek-V3's `config.json` carries `head_dim` = `qk_rope_head_dim` (the rope width, which YaRN
  uses) and `qk_head_dim` = nope + rope; neither is the value width.
- `deepseek_v3_bf16`: everything BF16 except `mlp.gate.weight` and `mlp.gate.e_score_correction_bias`
  (F32). `deepseek_v3_fp8`: projections F8_E4M3 with `<name>_scale_inv` F32 [ceil(out/128),
  ceil(in/128)]; embeddings, norms, `lm_head` and the router stay F32 (the hub keeps them BF16), and
  `config.json` has the hub's `quantization_config`.
- DeepSeek-V3 configs keep bos 0 / eos 1; `greedy_ids` were generated with no eos, so they may
  contain id 1.

| variant | exercises |
|---|---|
{rows}
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="model/tests/fixtures/hf")
    ap.add_argument("--only", nargs="*", choices=sorted(VARIANTS), help="regenerate only these variants")
    args = ap.parse_args()
    names = args.only or list(VARIANTS)
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hf_fixtures-") as tmp:
        for name in names:
            spec = VARIANTS[name]
            make_variant(name, spec, args.out, tmp)
            diff = check_variant(name, spec, args.out, tmp)
            meta = json.load(open(os.path.join(args.out, name, "meta.json")))
            size = sum(os.path.getsize(os.path.join(args.out, name, f)) for f in folder_files(os.path.join(args.out, name)))
            st = meta["stats"]
            print(
                f"{name}: {size / 1024:.0f} KiB, reload max|dlogits| {diff:.1e}, "
                f"greedy distinct {st['greedy_distinct_tokens']}, min margin {st['greedy_min_top2_margin']:.3g}, "
                f"routing {st['routing']}",
                file=sys.stderr,
            )
    rows = "\n".join(f"| `{n}` | {VARIANTS[n]['description']} |" for n in VARIANTS)
    with open(os.path.join(args.out, "README.md"), "w") as fh:
        fh.write(README.format(tv=transformers.__version__, torchv=torch.__version__.split("+")[0], rows=rows))


if __name__ == "__main__":
    main()
