#!/usr/bin/env bash
# Sets up what cargo cannot, once, so that plain `cargo build`, `cargo test` and
# the built binaries work afterwards with no exported variables:
#
#   1. a cached virtualenv with torch==2.11.0 from PyPI (tch 0.24.0 links against it),
#      under ${XDG_CACHE_HOME:-$HOME/.cache}/corvid/, shared by every clone;
#   2. the wasm32-wasip1 rustup target (the sandbox toolbox is built for it);
#   3. the link .corvid/torch -> that virtualenv's torch package, which
#      .cargo/config.toml points LIBTORCH and the binaries' rpath at.
#
# Idempotent: when everything is in place it only checks a stamp and two links.
set -euo pipefail

TORCH_VERSION=2.11.0
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache="${XDG_CACHE_HOME:-$HOME/.cache}/corvid"
venv="$cache/venv-torch-$TORCH_VERSION"
stamp="$venv/.corvid-ready"

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

# --- 2. the wasm32-wasip1 target ---------------------------------------------------
if command -v rustup >/dev/null; then
  if ! rustup target list --installed | grep -qx wasm32-wasip1; then
    say "adding rustup target wasm32-wasip1"
    rustup target add wasm32-wasip1
  fi
else
  say "warning: rustup not found; make sure the wasm32-wasip1 target is installed"
fi

# --- 3. stable links the cargo config points at -------------------------------------
mkdir -p "$root/.corvid"
ln -sfn "$torch_dir" "$root/.corvid/torch"
ln -sfn "$venv" "$root/.corvid/venv"
