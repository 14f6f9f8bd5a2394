"""Checks a finished `corvid run` on a Hugging Face folder against transformers, the round trip a
user makes when taking the trained model back to the ecosystem:

1. the checkpoint the run evaluated last (`eval/rl.json`), exported with `corvid model export`,
   loads in transformers with the run's tokenizer and chat template (its tokenizer files are the
   run's own, byte for byte);
2. for stored greedy evaluation episodes of that checkpoint, transformers' greedy `generate` from
   the episode's first prompt reproduces the episode's first generated ids;
3. every stored episode of the run, exported with `corvid replay export --format chat`, renders
   through `apply_chat_template(messages, tools=tools)` to the token ids Corvid stored (then the
   newline ChatML writes after the last turn), for the training store and the evaluation store;
   where the policy sampled ids that are not the tokenizer's encoding of their text, to the same
   text (see `check_renders`).

Prints a JSON summary and exits 1 when any check fails. A greedy continuation that differs only
where transformers' top two logits are within `--tie` of each other is counted as a tie (fp32
sums in another order), not a failure, and reported.

    .corvid/venv/bin/python scripts/hf_round_trip.py --run runs/hf-tiny
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "special_tokens_map.json", "chat_template_kwargs.json"]


def corvid_lines(corvid, *args):
    out = subprocess.run([corvid, *args], check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def stored_ids(raw, segment=None):
    """The episode's ids in order and its loss mask (true where the policy generated); only
    those of context segment `segment` when given (what the policy saw at once)."""
    ids, mask = [], []
    for step in raw["steps"]:
        if segment is not None and step.get("segment", 0) != segment:
            continue
        ids.extend(step["token_ids"])
        mask.extend(step["loss_mask"])
    return ids, mask


def first_turn(raw):
    """The ids before the first generated one, and the first turn's generated ids."""
    ids, mask = stored_ids(raw)
    start = mask.index(True)
    end = next((k for k in range(start, len(mask)) if not mask[k]), len(mask))
    return ids[:start], ids[start:end]


def check_renders(tok, raws, chats, kwargs):
    """Compares each stored episode with transformers' rendering of its chat export, segment by
    segment for an episode that folded (one chat line per context segment).

    Returns counts per kind and the episodes that fail. The rendering is the stored text plus the
    newline ChatML writes after the last turn (`exact` when its ids are the stored ids plus that
    newline), or plus `<|im_end|>` and the newline when the episode ended in a turn the policy did
    not close (cut by its token budget: `unclosed`). `non_canonical`: the text is the same but
    the policy sampled ids other than the tokenizer's own encoding of it (any id sequence is a
    valid sample; text cannot carry that, raw exports do); the first differing id must then be
    one the policy generated. `special_text_kept_plain`: the text is the same, but a tool result
    or error spells a special token (`</tool_call>`), which Corvid encodes as plain text, so that
    no tool output can forge a turn, where tokenizing the rendering makes it the special id; the
    first differing id must then be outside what the policy generated, and a special id in
    transformers' ids. `reasoning_rewritten`: an assistant turn's text holds `</think>`, which the
    template reads as a reasoning block and lays out again (or drops, before the last user turn),
    rewriting history that Corvid stored as sampled (a barely trained policy writes it by chance).
    `template_divergent`: the run flagged the episode (its export's `template_divergent`) because
    the template renders the finished conversation otherwise than the ids the policy saw, and the
    two texts differ only by empty think blocks (Qwen3's template writes one on the last assistant
    turn only) and an unclosed last turn's `<|im_end|>` (one with a `<think>` block the template
    lays out again counts as `reasoning_rewritten`); a flagged episode that renders back unchanged, or differs otherwise, fails, as
    does anything else. The flag is the episode's: of a folded one, a segment that renders back
    unchanged counts as such, and the episode fails only when every segment does.
    """
    by_id = {}
    for c in chats:
        by_id.setdefault(c["trajectory_id"], []).append(c)
    special = set(tok.added_tokens_decoder)
    counts = dict(exact=0, unclosed=0, non_canonical=0, special_text_kept_plain=0,
                  reasoning_rewritten=0, template_divergent=0, failed=0, segments=0)
    bad = []
    unchanged = {}  # a flagged folded trajectory: whether every segment so far rendered back unchanged
    segments = [(raw, chat) for raw in raws for chat in by_id.get(raw["header"]["trajectory_id"], [])]
    for raw, chat in segments:
        tid = raw["header"]["trajectory_id"]
        if "segment" in chat:
            tid += f" segment {chat['segment']}"
        ids, mask = stored_ids(raw, chat.get("segment", 0))
        counts["segments"] += 1
        want = tok.apply_chat_template(chat["messages"], tools=chat.get("tools"), tokenize=True,
                                       add_generation_prompt=False, **kwargs)
        want = list(want["input_ids"] if hasattr(want, "keys") else want)
        text, want_text = tok.decode(ids), tok.decode(want)
        suffix = next((t for t in ["\n", "<|im_end|>\n"] if want_text == text + t), None)
        at = next((k for k in range(min(len(ids), len(want))) if ids[k] != want[k]),
                  min(len(ids), len(want)))
        exact = suffix is not None and want == ids + tok(suffix, add_special_tokens=False)["input_ids"]
        if chat.get("template_divergent") and chat.get("segments", 1) > 1:
            # The flag is the trajectory's: some of its segments may render back unchanged,
            # not all of them.
            key = raw["header"]["trajectory_id"]
            unchanged[key] = unchanged.get(key, True) and exact
            if exact:
                counts["exact" if suffix == "\n" else "unclosed"] += 1
                continue
        if chat.get("template_divergent"):
            # Compared without empty think blocks, and with an unclosed last turn closed.
            def bare(t):
                t = t.replace("<think>\n\n</think>\n\n", "").rstrip()
                return t.removesuffix("<|im_end|>").rstrip()
            # The rendered string itself: tokenizing it would normalise what a random policy
            # wrote (NFC, bytes that are not UTF-8) and blur the template's difference.
            rendered = tok.apply_chat_template(chat["messages"], tools=chat.get("tools"),
                                               tokenize=False, add_generation_prompt=False,
                                               **kwargs)
            if rendered.rstrip() != text.rstrip() and bare(rendered) == bare(text):
                counts["template_divergent"] += 1
                continue
            if any(m["role"] == "assistant" and m.get("reasoning_content") is not None
                   for m in chat["messages"]):
                counts["reasoning_rewritten"] += 1
                continue
            counts["failed"] += 1
            bad.append(dict(id=tid, at=at, stored="flagged template_divergent: " + text[-200:],
                            transformers=rendered[-200:]))
        elif exact:
            counts["exact" if suffix == "\n" else "unclosed"] += 1
        elif suffix is not None and at < len(ids) and mask[at]:
            counts["non_canonical"] += 1
        elif suffix is not None and at < len(ids) and want[at] in special:
            counts["special_text_kept_plain"] += 1
        elif any(m["role"] == "assistant" and "</think>" in (m.get("content") or "")
                 for m in chat["messages"]):
            counts["reasoning_rewritten"] += 1
        else:
            counts["failed"] += 1
            bad.append(dict(id=tid, at=at, stored=tok.decode(ids[max(0, at - 20):at + 20]),
                            transformers=tok.decode(want[max(0, at - 20):at + 20])))
    for key, all_exact in unchanged.items():
        if all_exact:
            counts["failed"] += 1
            bad.append(dict(id=key, at=0, stored="flagged template_divergent, every segment renders back unchanged",
                            transformers=""))
    return counts, bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="the run folder, runs/<name>")
    ap.add_argument("--corvid", default="target/release/corvid")
    ap.add_argument("--episodes", type=int, default=16,
                    help="greedy evaluation episodes to regenerate with transformers")
    ap.add_argument("--tie", type=float, default=1e-4,
                    help="top-two logit gap under which a differing greedy id is a tie")
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, os.cpu_count() // 2))

    evaluated = json.load(open(os.path.join(a.run, "eval", "rl.json")))
    ckpt = evaluated["checkpoint"]
    if not os.path.isabs(ckpt):
        ckpt = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(a.run))), ckpt)
        if not os.path.isdir(ckpt):
            ckpt = os.path.abspath(evaluated["checkpoint"])
    summary = dict(checkpoint=ckpt, label=evaluated["label"])
    failed = []

    with tempfile.TemporaryDirectory() as tmp:
        export = os.path.join(tmp, "export")
        subprocess.run([a.corvid, "model", "export", "--model", ckpt, "--out", export,
                        "--dtype", "fp32"], check=True, capture_output=True)
        for name in TOKENIZER_FILES:
            ours = os.path.join(a.run, "hf", name)
            if os.path.exists(ours) and open(ours, "rb").read() != open(os.path.join(export, name), "rb").read():
                failed.append(f"the export's {name} differs from the run's")
        tok = AutoTokenizer.from_pretrained(export)
        # The template keywords the run rendered with (`[model] chat_template_kwargs`).
        kwargs_file = os.path.join(a.run, "hf", "chat_template_kwargs.json")
        kwargs = json.load(open(kwargs_file)) if os.path.exists(kwargs_file) else {}
        summary["chat_template_kwargs"] = kwargs
        model = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32).eval()

        # 2. Greedy generation from stored greedy evaluation episodes' first prompts.
        eval_store = os.path.join(a.run, "eval", "store")
        raws = [r for r in corvid_lines(a.corvid, "replay", "export", "--store", eval_store,
                                        "--format", "raw")
                if r["header"]["trajectory_id"].startswith(evaluated["label"] + ".")]
        greedy = dict(episodes=0, equal=0, ties=0, generated_ids=0)
        for raw in raws[:a.episodes]:
            context, generated = first_turn(raw)
            prompt = torch.tensor([context])
            with torch.no_grad():
                out = model.generate(prompt, max_new_tokens=len(generated), do_sample=False,
                                     eos_token_id=None, pad_token_id=tok.pad_token_id,
                                     output_scores=True, return_dict_in_generate=True)
            theirs = out.sequences[0, len(context):].tolist()
            greedy["episodes"] += 1
            greedy["generated_ids"] += len(generated)
            if theirs == generated:
                greedy["equal"] += 1
                continue
            at = next(k for k in range(len(generated)) if theirs[k] != generated[k])
            top2 = out.scores[at][0].topk(2).values
            gap = float(top2[0] - top2[1])
            if gap < a.tie:
                greedy["ties"] += 1
            else:
                failed.append(f"{raw['header']['trajectory_id']}: transformers' greedy id {at} is "
                              f"{theirs[at]}, Corvid stored {generated[at]} (top-two gap {gap:.2e})")
        summary["greedy"] = greedy
        if greedy["episodes"] == 0:
            failed.append(f"no stored episode of {evaluated['label']} in {eval_store}")

        # 3. Chat exports render to the stored ids, in both stores.
        renders = {}
        for name, store in [("train", os.path.join(a.run, "store")), ("eval", eval_store)]:
            raws = corvid_lines(a.corvid, "replay", "export", "--store", store, "--format", "raw")
            chats = corvid_lines(a.corvid, "replay", "export", "--store", store, "--format", "chat")
            exported = {c["trajectory_id"] for c in chats}
            if len(raws) != len(exported):
                failed.append(f"{name}: {len(raws)} raw lines, chat lines of {len(exported)} trajectories")
                continue
            counts, bad = check_renders(tok, raws, chats, kwargs)
            renders[name] = dict(episodes=len(raws), **counts)
            if name == "eval":  # per evaluated stage: `<label>.<family>.L<level>...`
                for label in sorted({r["header"]["trajectory_id"].split(".")[0] for r in raws}):
                    mine = [r for r in raws if r["header"]["trajectory_id"].startswith(label + ".")]
                    renders[name][label] = dict(episodes=len(mine), **check_renders(tok, mine, chats, kwargs)[0])
            failed.extend(f"{name} {b['id']}: id {b['at']} differs: stored {b['stored']!r}, "
                          f"transformers {b['transformers']!r}" for b in bad[:5])
        summary["renders"] = renders

    summary["failed"] = failed
    print(json.dumps(summary, indent=1))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
