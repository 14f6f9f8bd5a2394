"""A reference for Corvid's SFT: the dense GPT of shared/research/learning_feasibility.md
(d128, 4 layers, 4 heads of 32, GELU 512, pre-LayerNorm, RoPE, tied embeddings; 0.83M
parameters) trained in PyTorch on the exact demonstration rows Corvid trains on, with the
held-out loss split as `learner/examples/sft_probe.rs` splits it (first path character,
rest of the path, answer digits, format). It answers "is it the data or our model?".

    cargo run --release -p corvid-learner --example sft_dump -- 3000 1,2 sft.jsonl held.jsonl
    T=1 ~/.cache/corvid/venv-torch-2.11.0/bin/python scripts/sft_reference.py \
        sft.jsonl held.jsonl STEPS BATCH_TOKENS LR [EVERY]

T = torch threads. Batches take rows in order until BATCH_TOKENS; AdamW (0.9, 0.98), weight
decay 0.01 on matrices, 100 warm-up steps, cosine to 0.1x, clip 1.0 (the probe's recipe).
Results: docs/bench/raw/sft-sweep.md.
"""
import json, math, sys, time, torch, torch.nn as nn, torch.nn.functional as F
torch.set_num_threads(int(__import__('os').environ.get('T', '1')))
torch.manual_seed(0)
sft, held, steps, btok, lr = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
every = int(sys.argv[6]) if len(sys.argv) > 6 else 50
rows = [json.loads(l) for l in open(sft)]
hrows = [json.loads(l) for l in open(held)]
V, D, L, H, FF = 264, 128, 4, 4, 512
PAD = 263
def parts(r):
    text = b''; out = []
    for i, t in enumerate(r['tokens']):
        text += bytes([t]) if t < 256 else b'\x00'
        if not r['mask'][i]: out.append(None); continue
        def op(key):
            at = text.rfind(key)
            if at < 0: return None
            at += len(key); return (at, b'"' not in text[at:])
        p, a = op(b'"path":"'), op(b'"answer":"')
        if p and p[1] and p[0] == len(text): out.append(0)
        elif p and p[1]: out.append(1)
        elif a and a[1]: out.append(2)
        else: out.append(3)
    return out
hparts = [parts(r) for r in hrows]
class Rope:
    def __init__(s, hd, T=2048):
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd)); t = torch.arange(T).float()
        f = torch.outer(t, inv); s.cos, s.sin = f.cos(), f.sin()
    def __call__(s, x):  # x [B,H,T,hd]
        T = x.shape[2]; c, si = s.cos[:T], s.sin[:T]
        x1, x2 = x[..., ::2], x[..., 1::2]
        return torch.stack([x1 * c - x2 * si, x1 * si + x2 * c], -1).flatten(-2)
rope = Rope(D // H)
class Block(nn.Module):
    def __init__(s):
        super().__init__(); s.ln1 = nn.LayerNorm(D); s.qkv = nn.Linear(D, 3 * D); s.o = nn.Linear(D, D)
        s.ln2 = nn.LayerNorm(D); s.f1 = nn.Linear(D, FF); s.f2 = nn.Linear(FF, D)
    def forward(s, x):
        B, T, _ = x.shape
        q, k, v = s.qkv(s.ln1(x)).view(B, T, 3, H, D // H).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True)
        x = x + s.o(y.transpose(1, 2).reshape(B, T, D))
        return x + s.f2(F.gelu(s.f1(s.ln2(x))))
class GPT(nn.Module):
    def __init__(s):
        super().__init__(); s.emb = nn.Embedding(V, D); s.blocks = nn.ModuleList([Block() for _ in range(L)]); s.ln = nn.LayerNorm(D)
        s.apply(lambda m: nn.init.normal_(m.weight, 0, 0.02) if isinstance(m, (nn.Linear, nn.Embedding)) else None)
    def forward(s, x):
        h = s.emb(x)
        for b in s.blocks: h = b(h)
        return s.ln(h) @ s.emb.weight.T
m = GPT(); print('params', sum(p.numel() for p in m.parameters()))
decay = [p for p in m.parameters() if p.dim() >= 2]; nod = [p for p in m.parameters() if p.dim() < 2]
opt = torch.optim.AdamW([{'params': decay, 'weight_decay': 0.01}, {'params': nod, 'weight_decay': 0}], lr=lr, betas=(0.9, 0.98))
def batch(rs):
    T = max(len(r['tokens']) for r in rs)
    x = torch.full((len(rs), T), PAD); y = torch.full((len(rs), T), -100)
    for i, r in enumerate(rs):
        n = len(r['tokens']); x[i, :n] = torch.tensor(r['tokens'])
        tgt = torch.tensor(r['tokens'][1:] + [PAD]); msk = torch.tensor(r['mask'])
        y[i, :n] = torch.where(msk, tgt, torch.full_like(tgt, -100))
    return x, y
def evaluate():
    acc = [[0.0, 0, 0] for _ in range(4)]
    with torch.no_grad():
        for r, ps in zip(hrows, hparts):
            x, y = batch([r]); lp = m(x)[0].log_softmax(-1); am = lp.argmax(-1)
            for i, p in enumerate(ps):
                if p is None: continue
                t = y[0, i].item(); acc[p][0] -= lp[i, t].item(); acc[p][1] += int(am[i].item() == t); acc[p][2] += 1
    return '  '.join(f'{a[0]/max(a[2],1):.3f}({100*a[1]/max(a[2],1):.0f}%)' for a in acc)
pos, tok, t0 = 0, 0, time.time()
for step in range(steps):
    rs, n = [], 0
    while n < btok:
        r = rows[pos % len(rows)]; pos += 1; rs.append(r); n += len(r['tokens'])
    w = min(1, (step + 1) / 100); prog = step / steps
    for g in opt.param_groups: g['lr'] = lr * w * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * prog)))
    x, y = batch(rs); logits = m(x)
    loss = F.cross_entropy(logits.view(-1, V), y.view(-1), ignore_index=-100)
    opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0); opt.step(); tok += n
    if (step + 1) % every == 0:
        print(f'{step+1:5d} {time.time()-t0:6.0f}s {tok/(time.time()-t0):6.0f} tok/s loss {loss.item():.3f} | p0 p1.. ans fmt: {evaluate()}', flush=True)
