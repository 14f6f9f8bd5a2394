"""Writes the chat-template fixtures of `tokenizer/tests/template_parity.rs`.

For each template below, a folder `tokenizer/tests/fixtures/<name>/` with what a Hugging Face
tokenizer folder holds (`tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja`, written
by transformers' `save_pretrained`) and `expected.json`: conversations (with and without tools,
tool calls and results, reasoning, several turns) and what transformers' `apply_chat_template`
makes of each, as text and as token ids. The tokenizer is a small byte-level BPE trained with the
`tokenizers` library on chat-like text; its special tokens are the template's markers.

The templates are written for these fixtures in the formats the models use (ChatML with Hermes /
Qwen3 tool calls and `<think>` blocks; a BOS/EOS-delimited one that refuses bad roles); they are
not copies of any model's file.

Run with the pinned transformers of the bootstrapped virtualenv (same bytes every time):

    .corvid/venv/bin/python scripts/tokenizer_fixtures.py --out tokenizer/tests/fixtures
"""

import argparse
import json
import os
import sys

import tokenizers
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

# ChatML with tools in the system turn, Hermes-style <tool_call> JSON, tool results grouped in a
# user turn as <tool_response>, and <think> blocks kept only after the last user query.
CHATML_TOOLS = r"""{%- set ns = namespace(last_user=-1) %}
{%- for m in messages %}
    {%- if m.role == 'user' and not (m.content is string and m.content.startswith('<tool_response>')) %}
        {%- set ns.last_user = loop.index0 %}
    {%- endif %}
{%- endfor %}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- '# Tools\n\nCall a function with a JSON object in <tool_call></tool_call> tags. Available functions:\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' + tool | tojson }}
    {%- endfor %}
    {{- '\n</tools><|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for m in messages %}
    {%- if m.role == 'system' %}
        {%- if not loop.first %}
            {{- raise_exception('a system message must come first') }}
        {%- endif %}
    {%- elif m.role == 'user' %}
        {{- '<|im_start|>user\n' + m.content + '<|im_end|>\n' }}
    {%- elif m.role == 'assistant' %}
        {%- set content = m.content if m.content is string else '' %}
        {%- set reasoning = '' %}
        {%- if m.reasoning_content is string %}
            {%- set reasoning = m.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {{- '<|im_start|>assistant\n' }}
        {%- if loop.index0 > ns.last_user and reasoning %}
            {{- '<think>\n' + reasoning + '\n</think>\n\n' }}
        {%- endif %}
        {{- content }}
        {%- for call in m.tool_calls or [] %}
            {%- set f = call.function if call.function is defined else call %}
            {%- if loop.first and content %}
                {{- '\n' }}
            {%- elif not loop.first %}
                {{- '\n' }}
            {%- endif %}
            {{- '<tool_call>\n{"name": "' + f.name + '", "arguments": ' }}
            {%- if f.arguments is string %}
                {{- f.arguments }}
            {%- else %}
                {{- f.arguments | tojson }}
            {%- endif %}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif m.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + m.content + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- else %}
        {{- raise_exception('unknown role ' + m.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
"""

# BOS once, then `[role] content` turns closed by EOS; roles other than user/assistant alternating
# are refused.
BOS_EOS = r"""{{ bos_token }}
{%- for m in messages %}
    {%- if (m.role == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('roles must alternate user/assistant/...') }}
    {%- endif %}
    {{- '[' + m.role | upper + '] ' + m.content | trim + eos_token }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '[ASSISTANT] ' }}
{%- endif %}
"""

CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
                   "<tool_response>", "</tool_response>", "<think>", "</think>"]

# Tool schemas as the OpenAI function format writes them, keys in sorted order (Corvid's maps
# come sorted, so Python's insertion order and Corvid's agree).
TOOLS = [
    {"function": {"description": "Read a file of the workspace.", "name": "read_file",
                  "parameters": {"properties": {"path": {"description": "Path, e.g. notes/a.txt",
                                                         "type": "string"}},
                                 "required": ["path"], "type": "object"}},
     "type": "function"},
    {"function": {"description": "Run a shell-like command; returns stdout.", "name": "run",
                  "parameters": {"properties": {"cmd": {"type": "string"},
                                                "timeout_s": {"default": 2.5, "type": "number"}},
                                 "required": ["cmd"], "type": "object"}},
     "type": "function"},
]


def call(name, **arguments):
    return {"function": {"arguments": arguments, "name": name}, "type": "function"}


CHATML_CASES = [
    dict(name="one user turn", messages=[{"role": "user", "content": "What is in notes/a.txt?"}],
         add_generation_prompt=True),
    dict(name="system and turns", messages=[
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Count to 3."},
    ], add_generation_prompt=True),
    dict(name="a tool call and its result", tools=TOOLS, messages=[
        {"role": "system", "content": "Use the tools."},
        {"role": "user", "content": "What does notes/a.txt say?"},
        {"role": "assistant", "content": "", "tool_calls": [call("read_file", path="notes/a.txt")]},
        {"role": "tool", "content": "the key is 42"},
        {"role": "assistant", "content": "It says the key is 42."},
    ]),
    dict(name="two calls, two results, thinking off", tools=TOOLS, messages=[
        {"role": "user", "content": "Compare a and b."},
        {"role": "assistant", "content": "Reading both.", "tool_calls": [
            call("read_file", path="a"), call("run", cmd="cat b | wc -l", timeout_s=1.0)]},
        {"role": "tool", "content": "alpha"},
        {"role": "tool", "content": "error: b: no such file"},
    ], add_generation_prompt=True, kwargs={"enable_thinking": False}),
    dict(name="reasoning is dropped before the last query", tools=TOOLS, messages=[
        {"role": "user", "content": "First?"},
        {"role": "assistant", "content": "<think>\nearly thought\n</think>\n\nFirst answer."},
        {"role": "user", "content": "Second?"},
        {"role": "assistant", "content": "<think>\nlate thought\n</think>\n\nSecond answer."},
    ]),
    dict(name="JSON and unicode in arguments", tools=TOOLS, messages=[
        {"role": "user", "content": "Write it: café \"quoted\"\nnext line"},
        {"role": "assistant", "content": "", "tool_calls": [
            call("run", cmd="printf 'café \"q\"\\n\\tx'", timeout_s=1e-05)]},
        {"role": "tool", "content": "café \"q\"\n\tx"},
    ], add_generation_prompt=True),
    dict(name="a system message later is refused", messages=[
        {"role": "user", "content": "Hi"}, {"role": "system", "content": "late"}],
         error="a system message must come first"),
]

BOS_EOS_CASES = [
    dict(name="alternating turns", messages=[
        {"role": "user", "content": "  Hi  "}, {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Bye"}], add_generation_prompt=True),
    dict(name="bad order is refused", messages=[
        {"role": "assistant", "content": "first"}], error="roles must alternate"),
]

CORPUS = [
    "What is in notes/a.txt? Read the file and answer with the key.",
    "The key is 42. It says the key is 42. Count to 3: 1, 2, 3.",
    '{"name": "read_file", "arguments": {"path": "notes/a.txt"}}',
    '{"name": "run", "arguments": {"cmd": "cat b | wc -l", "timeout_s": 1.0}}',
    "You answer briefly. Use the tools. Compare a and b. Reading both.",
    "# Tools\n\nCall a function with a JSON object. Available functions:",
    '{"type": "function", "function": {"name": "read_file", "description": "Read a file of the workspace.", '
    '"parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}',
    "error: b: no such file. alpha beta gamma delta. First answer. Second answer. early late thought",
    "café printf quoted next line Write it Hello Hi Bye USER ASSISTANT",
]

TEMPLATES = {
    "chatml_tools": dict(template=CHATML_TOOLS, specials=CHATML_SPECIALS, cases=CHATML_CASES,
                         tokens=dict(eos_token="<|im_end|>", pad_token="<|endoftext|>")),
    "bos_eos": dict(template=BOS_EOS, specials=["<s>", "</s>", "<pad>"], cases=BOS_EOS_CASES,
                    tokens=dict(bos_token="<s>", eos_token="</s>", pad_token="<pad>")),
}


def train_tokenizer(specials):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    return tok


def make(name, spec, out_root):
    folder = os.path.join(out_root, name)
    os.makedirs(folder, exist_ok=True)
    fast = PreTrainedTokenizerFast(tokenizer_object=train_tokenizer(spec["specials"]),
                                   chat_template=spec["template"], **spec["tokens"])
    fast.save_pretrained(folder)
    fast = transformers.AutoTokenizer.from_pretrained(folder)
    cases = []
    for case in spec["cases"]:
        kwargs = dict(case.get("kwargs", {}))
        entry = dict(name=case["name"], messages=case["messages"], tools=case.get("tools"),
                     add_generation_prompt=case.get("add_generation_prompt", False), kwargs=kwargs)
        try:
            text = fast.apply_chat_template(case["messages"], tools=case.get("tools"), tokenize=False,
                                            add_generation_prompt=entry["add_generation_prompt"],
                                            **kwargs)
        except Exception as e:  # the template's raise_exception
            if "error" not in case or case["error"] not in str(e):
                raise
            entry["error"] = case["error"]
        else:
            assert "error" not in case, f"{name}/{case['name']} rendered but should fail"
            entry["text"] = text
            entry["ids"] = fast(text, add_special_tokens=False)["input_ids"]
        cases.append(entry)
    with open(os.path.join(folder, "expected.json"), "w") as fh:
        json.dump(dict(transformers=transformers.__version__, tokenizers=tokenizers.__version__,
                       cases=cases), fh, indent=1, ensure_ascii=False, sort_keys=True)
        fh.write("\n")
    print(f"{name}: {len(cases)} cases, vocab {fast.vocab_size + len(fast.added_tokens_decoder)}",
          file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="tokenizer/tests/fixtures")
    a = ap.parse_args()
    for name, spec in TEMPLATES.items():
        make(name, spec, a.out)


if __name__ == "__main__":
    main()
