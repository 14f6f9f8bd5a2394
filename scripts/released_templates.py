"""transformers' renderings of short tool conversations under the released chat templates: the
oracle of `episode/tests/released.rs`.

    released_templates.py --released .corvid/released > out.json

For each released folder (scripts/released_files.py), each set of template keywords and each
case (calls and results, an error, with and without thinking) it prints:

- `messages`, `tools`, `kwargs`: the conversation as Corvid's chat layout hands it to the
  template (a call's id and the form of its arguments follow the folder's tool-call syntax);
- `prompt`: the rendering of the messages before the first assistant turn, with the
  generation prompt;
- `segments`: for each assistant turn that more messages follow, what the template writes
  after that closed turn through the next generation prompt, cut from transformers'
  rendering of the real conversation at the end-of-turn token that closes the turn (the
  history alone, without a generation prompt, holds n of them: the cut is after the n-th);
  null where the template does not close an assistant turn with that token;
- `full`: the rendering of the whole conversation; `full_ids` its ids through the last
  end-of-turn token, where the folder has a tokenizer.
"""

import argparse
import json
import os
import sys

from transformers import AutoTokenizer
from transformers.utils.chat_template_utils import render_jinja_template

TOOLS = [
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a file of the workspace.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                       "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "answer", "description": "Give the final answer.",
        "parameters": {"type": "object", "properties": {"answer": {"type": "string"}},
                       "required": ["answer"]}}},
]
# Keys sorted, as Corvid's JSON maps come (a template's `tojson` keeps a map's order).
TOOLS = json.loads(json.dumps(TOOLS, sort_keys=True))

# folder -> (tool-call syntax, end-of-turn token, [(template keywords, cases)])
FOLDERS = {
    "qwen3": ("hermes", "<|im_end|>", [({}, ["calls", "error", "thinking"]),
                                        ({"enable_thinking": False}, ["calls", "error"])]),
    "qwen3_2507": ("hermes", "<|im_end|>", [({}, ["calls", "error"])]),
    "deepseek_v3": ("deepseek_v3", "<｜end▁of▁sentence｜>", [({}, ["calls", "error"])]),
    "deepseek_r1_distill": ("deepseek_v3", "<｜end▁of▁sentence｜>", [({}, ["calls", "error"])]),
    # V3.1's thinking mode opens `<think>` in the generation prompt after a user turn only.
    "deepseek_v31": ("deepseek_v31", "<｜end▁of▁sentence｜>", [({}, ["calls", "error"]),
                                                            ({"thinking": True}, ["thinking"])]),
    "kimi_k2": ("kimi_k2", "<|im_end|>", [({}, ["calls", "error"])]),
}


def py_json(value):
    return json.dumps(value, ensure_ascii=False)


def call_message(syntax, n, name, arguments, reasoning=None):
    """An assistant turn that makes one call, as Corvid's chat layout writes it for the template."""
    call_id = f"functions.{name}:0" if syntax == "kimi_k2" else f"call_{n}"
    args = arguments if syntax in ("deepseek_v31", "kimi_k2") else py_json(arguments)
    m = {"role": "assistant", "content": None if syntax == "deepseek_v3" else "",
         "tool_calls": [{"type": "function", "function": {"name": name, "arguments": args},
                         "id": call_id}]}
    if reasoning is not None:
        m["reasoning_content"] = reasoning
    return m, call_id


def tool_message(content, call_id=None):
    m = {"role": "tool", "content": content}
    if call_id is not None:
        m["tool_call_id"] = call_id
    return m


def case_messages(syntax, case):
    user = {"role": "user", "content": "What is the value in notes/a.txt? Answer with it."}
    if case == "calls":
        a0, id0 = call_message(syntax, 0, "read_file", {"path": "notes/a.txt"})
        a1, id1 = call_message(syntax, 1, "read_file", {"path": "notes/b.txt"})
        a2, _ = call_message(syntax, 2, "answer", {"answer": "42"})
        return [user, a0, tool_message("see notes/b.txt", id0), a1,
                tool_message("value: 42", id1), a2]
    if case == "error":
        a0, id0 = call_message(syntax, 0, "read_file", {"path": "notes/c.txt"})
        text = {"role": "assistant", "content": "I will read notes/a.txt instead."}
        a2, id2 = call_message(syntax, 2, "read_file", {"path": "notes/a.txt"})
        a3, _ = call_message(syntax, 3, "answer", {"answer": "42"})
        return [user, a0, tool_message("error: not_found: notes/c.txt", id0), text,
                tool_message("error: invalid_call: no tool call in the turn"), a2,
                tool_message("value: 42", id2), a3]
    if case == "thinking":
        a0, id0 = call_message(syntax, 0, "read_file", {"path": "notes/a.txt"},
                               reasoning="The value should be in notes/a.txt.")
        # DeepSeek-V3.1 opens no think block after a tool result: that turn has no reasoning.
        second = None if syntax == "deepseek_v31" else "It says 42."
        a1, _ = call_message(syntax, 1, "answer", {"answer": "42"}, reasoning=second)
        return [user, a0, tool_message("value: 42", id0), a1]
    raise ValueError(case)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--released", required=True)
    args = p.parse_args()
    out = []
    for folder, (syntax, eot, runs) in FOLDERS.items():
        path = os.path.join(args.released, folder)
        has_tokenizer = os.path.isfile(os.path.join(path, "tokenizer.json"))
        if has_tokenizer:
            tok = AutoTokenizer.from_pretrained(path)
            template = tok.chat_template
            specials = {k: getattr(tok, k) for k in ("bos_token", "eos_token", "pad_token",
                                                     "unk_token") if getattr(tok, k)}
        else:
            tok = None
            with open(os.path.join(path, "chat_template.jinja"), encoding="utf-8") as f:
                template = f.read()
            specials = {}
        for kwargs, cases in runs:
            def render(messages, gen):
                return render_jinja_template(
                    conversations=[messages], tools=TOOLS, chat_template=template,
                    add_generation_prompt=gen, **specials, **kwargs)[0][0]

            for case in cases:
                messages = case_messages(syntax, case)
                assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
                prompt = render(messages[:assistant[0]], True)
                segments = []
                for n, i in enumerate(assistant[:-1]):
                    closed = render(messages[:i + 1], False)
                    turns = closed.count(eot)
                    if not closed.rstrip().endswith(eot):
                        # The template does not close an assistant turn with the end-of-turn
                        # token (R1-Distill's leaves a call open): no segment can follow.
                        segments = None
                        break
                    full = render(messages[:assistant[n + 1]], True)
                    at = -1
                    for _ in range(turns):
                        at = full.index(eot, at + 1)
                    segments.append(full[at + len(eot):])
                full = render(messages, False)
                line = {"folder": folder, "syntax": syntax, "case": case, "kwargs": kwargs,
                        "messages": messages, "tools": TOOLS, "prompt": prompt,
                        "segments": segments, "full": full, "end_of_turn": eot}
                if tok is not None:
                    through = full[:full.rindex(eot) + len(eot)]
                    line["full_ids"] = tok(through, add_special_tokens=False)["input_ids"]
                out.append(line)
    json.dump(out, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
