#!/usr/bin/env python3
"""PyTorch-eager twin of the Corvid policy model, for `corvid bench model`'s ratio_vs_pytorch.

Same architecture as learner/src/model (MLA with gate and cross-layer residual, fp32 top-k
router with selection bias, grouped-GEMM experts, shared expert), same config (passed as the
JSON of ModelConfig), same batch, sequence and thread count, same work per step: zero grads,
forward, cross-entropy, backward. Prints one JSON object.
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def linear(i, o, std):
    lin = nn.Linear(i, o, bias=False)
    nn.init.normal_(lin.weight, std=std)
    return lin


class Rope:
    def __init__(self, dim, theta, max_pos):
        inv = theta ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None]
        self.cos, self.sin = ang.cos().float(), ang.sin().float()

    def apply(self, x, t):  # x [B, T, H, R]
        half = x.shape[-1] // 2
        cos, sin = self.cos[:t, None, :], self.sin[:t, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


class MLA(nn.Module):
    def __init__(self, c, layer):
        super().__init__()
        d, h = c["hidden_size"], c["num_attention_heads"]
        self.h, self.n, self.r, self.v = h, c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        self.c = c["kv_lora_rank"]
        std = c["initializer_range"]
        qk = self.n + self.r
        if c["q_lora_rank"] is None:
            self.q_proj = linear(d, h * qk, std)
        else:
            self.q_a = linear(d, c["q_lora_rank"], std)
            self.q_norm = RMSNorm(c["q_lora_rank"], c["rms_norm_eps"])
            self.q_b = linear(c["q_lora_rank"], h * qk, std)
        self.owns = layer % c["cla_factor"] == 0
        if self.owns:
            self.kv_a = linear(d, self.c + self.r, std)
            self.kv_norm = RMSNorm(self.c, c["rms_norm_eps"])
        self.kv_b = linear(self.c, h * (self.n + self.v), std)
        self.o_proj = linear(h * self.v, d, std / math.sqrt(2 * c["num_hidden_layers"]))
        self.gate_kind = c["attn_gate"]
        if self.gate_kind == "headwise":
            self.gate = linear(d, h, std)
        elif self.gate_kind == "elementwise":
            self.gate = linear(d, h * self.v, std)
        self.scale = 1.0 / math.sqrt(qk)

    def latent(self, x, rope):
        b, t, _ = x.shape
        kv = self.kv_a(x)
        ckv = self.kv_norm(kv[..., : self.c])
        kpe = rope.apply(kv[..., self.c :].view(b, t, 1, self.r), t).view(b, t, self.r)
        return ckv, kpe

    def forward(self, x, lat, rope):
        b, t, _ = x.shape
        q = self.q_proj(x) if hasattr(self, "q_proj") else self.q_b(self.q_norm(self.q_a(x)))
        q = q.view(b, t, self.h, self.n + self.r)
        q = torch.cat([q[..., : self.n], rope.apply(q[..., self.n :], t)], -1).transpose(1, 2)
        ckv, kpe = lat
        kv = self.kv_b(ckv).view(b, t, self.h, self.n + self.v)
        k = torch.cat([kv[..., : self.n], kpe.view(b, t, 1, self.r).expand(b, t, self.h, self.r)], -1)
        v = kv[..., self.n :]
        qk = self.n + self.r
        vp = F.pad(v, (0, qk - self.v)) if self.v < qk else v
        o = F.scaled_dot_product_attention(q, k.transpose(1, 2), vp.transpose(1, 2), is_causal=True, scale=self.scale)
        o = o[..., : self.v].transpose(1, 2)
        if self.gate_kind == "headwise":
            o = o * torch.sigmoid(self.gate(x)).view(b, t, self.h, 1)
        elif self.gate_kind == "elementwise":
            o = o * torch.sigmoid(self.gate(x)).view(b, t, self.h, self.v)
        return self.o_proj(o.reshape(b, t, self.h * self.v))


class CrossLayer(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.query = nn.Parameter(torch.zeros(d))
        self.scale = nn.Parameter(torch.zeros(d))
        self.eps = eps

    def forward(self, hist, a):
        if not hist:
            return a
        hs = torch.stack(hist, 0).float()
        keys = hs * torch.rsqrt(hs.pow(2).mean(-1, keepdim=True) + self.eps)
        w = (keys * self.query).sum(-1).softmax(0).unsqueeze(-1)
        return a + self.scale * (w * hs).sum(0)


class Mlp(nn.Module):
    def __init__(self, d, f, std):
        super().__init__()
        self.g, self.u, self.dn = linear(d, f, std), linear(d, f, std), linear(f, d, std)

    def forward(self, x):
        return self.dn(F.silu(self.g(x)) * self.u(x))


class MoE(nn.Module):
    def __init__(self, c):
        super().__init__()
        e, d, f = c["n_routed_experts"], c["hidden_size"], c["moe_intermediate_size"]
        self.k, self.e = c["num_experts_per_tok"], e
        self.router = nn.Parameter(torch.randn(e, d) * c["initializer_range"])
        self.register_buffer("bias", torch.zeros(e))
        std = c["expert_init_std"]
        dstd = std / math.sqrt(2 * c["num_hidden_layers"])
        self.w_gate = nn.Parameter(torch.randn(e, d, f).mul(std).clamp(-2 * std, 2 * std))
        self.w_up = nn.Parameter(torch.randn(e, d, f).mul(std).clamp(-2 * std, 2 * std))
        self.w_down = nn.Parameter(torch.randn(e, f, d).mul(dstd).clamp(-2 * dstd, 2 * dstd))
        self.act = c["expert_act"]
        self.dispatch = c["expert_dispatch"]
        self.gate_scale = c["expert_gate_scale"]
        self.softmax = c["scoring_func"] == "softmax"
        self.norm = c["norm_topk_prob"]
        self.scaling = c["routed_scaling_factor"]
        ns = c["n_shared_experts"]
        self.shared = Mlp(d, ns * f, c["initializer_range"]) if ns > 0 else None

    def glu(self, g, u):
        g = g * self.gate_scale
        if self.act["type"] == "swiglu":
            return F.silu(g) * u
        b, bl = self.act["beta"], self.act["beta_lin"]
        return b * torch.tanh(g / b) * torch.sigmoid(g) * (bl * torch.tanh(u / bl))

    def forward(self, x):
        b, t, d = x.shape
        xt = x.reshape(b * t, d)
        logits = xt.float() @ self.router.float().t()
        scores = logits.softmax(-1) if self.softmax else logits.sigmoid()
        vals, idx = (scores.detach() + self.bias).topk(self.k + 1, -1)
        idx = idx[:, : self.k]
        w = scores.gather(1, idx)
        if self.norm:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        w = (w * self.scaling).to(x.dtype)
        flat = idx.reshape(-1)
        order = flat.argsort(stable=True)
        tok = order // self.k
        offs = torch.bincount(flat, minlength=self.e).cumsum(0).to(torch.int32)
        if self.dispatch == "grouped_mm":
            xr = xt.index_select(0, tok)
            a = self.glu(torch._grouped_mm(xr, self.w_gate, offs), torch._grouped_mm(xr, self.w_up, offs))
            yr = torch._grouped_mm(a, self.w_down, offs) * w.reshape(-1).index_select(0, order).unsqueeze(1)
            y = torch.zeros_like(xt).index_add(0, tok, yr)
        else:  # per-expert loop, as ExpertDispatch::Loop
            y = torch.zeros_like(xt)
            wf = w.reshape(-1)
            for e in range(self.e):
                rows = (flat == e).nonzero().squeeze(1)
                if rows.numel() == 0:
                    continue
                te = rows // self.k
                xe = xt.index_select(0, te)
                ye = self.glu(xe @ self.w_gate[e], xe @ self.w_up[e]) @ self.w_down[e]
                y = y.index_add(0, te, ye * wf.index_select(0, rows).unsqueeze(1))
        if self.shared is not None:
            y = y + self.shared(xt)
        return y.view(b, t, d)


class Block(nn.Module):
    def __init__(self, c, i):
        super().__init__()
        d, eps = c["hidden_size"], c["rms_norm_eps"]
        self.n1, self.n2 = RMSNorm(d, eps), RMSNorm(d, eps)
        self.attn = MLA(c, i)
        self.cross = CrossLayer(d, eps) if c["cross_layer_residual"] and i > 0 else None
        self.ffn = MoE(c) if i >= c["first_k_dense_replace"] else Mlp(d, c["intermediate_size"], c["initializer_range"])


class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed = nn.Parameter(torch.randn(c["vocab_size"], c["hidden_size"]) * c["initializer_range"])
        self.blocks = nn.ModuleList([Block(c, i) for i in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.head = None if c["tie_word_embeddings"] else linear(c["hidden_size"], c["vocab_size"], c["initializer_range"])
        self.rope = Rope(c["qk_rope_head_dim"], c["rope_theta"], c["max_position_embeddings"])

    def forward(self, tokens):
        x = F.embedding(tokens, self.embed)
        hist, lat = [], None
        for blk in self.blocks:
            h = blk.n1(x)
            if blk.attn.owns:
                lat = blk.attn.latent(h, self.rope)
            a = blk.attn(h, lat, self.rope)
            mixed = blk.cross(hist, a) if blk.cross is not None else a
            hist.append(a)
            x = x + mixed
            x = x + blk.ffn(blk.n2(x))
        h = self.norm(x)
        return h @ self.embed.t() if self.head is None else self.head(h)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config-json", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    c = json.loads(a.config_json)
    model = Model(c)
    tokens = torch.randint(c["vocab_size"], (a.batch, a.seq + 1))
    inp, tgt = tokens[:, :-1], tokens[:, 1:]

    def step():
        model.zero_grad(set_to_none=False)
        logits = model(inp)
        F.cross_entropy(logits.reshape(-1, c["vocab_size"]), tgt.reshape(-1)).backward()

    for _ in range(a.warmup):
        step()
    best = float("inf")  # the fastest step, as the Rust side: robust to shared cores
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - t0)
    print(json.dumps({
        "train_tokens_per_s": a.batch * a.seq / best,
        "torch": torch.__version__,
        "threads": a.threads,
        "batch": a.batch,
        "seq": a.seq,
        "steps": a.steps,
    }))


if __name__ == "__main__":
    main()
