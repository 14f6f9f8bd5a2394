#!/usr/bin/env bash
# The one GPU check (issue 9): runs the carried release binary's `corvid bench gpu` on a machine
# with a CUDA GPU and PyTorch (the lent H200 image: PyTorch 2.11.0+cu130, no Rust), prints the
# table last and leaves the JSON report in $OUT/gpu.json (or ./gpu.json without $OUT).
#
# The loader and libtorch set-up is scripts/gpu-env.sh's.
#
# Usage: scripts/gpu-check.sh [extra `corvid bench gpu` flags]
# Budget: well under 8 minutes on one H200 (the bench stops nothing itself; `timeout` below
# cuts it at 7.5 minutes so the JSON written after each finished section still comes back).
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/gpu-env.sh

out_dir=${OUT:-.}
mkdir -p "$out_dir"
echo "gpu-check: torch $("$py" -c 'import torch; print(torch.__version__, torch.version.cuda)') at $torch_dir" >&2
if command -v nvidia-smi >/dev/null; then nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >&2 || true; fi
echo "gpu-check: $(ldd "$bin" | grep -E 'libtorch_cuda|libc10_cuda|not found' | tr -s ' \t' ' ' | tr '\n' ';')" >&2

set +e
timeout 450 "$bin" bench gpu --json --out "$out_dir/gpu.json" "$@" 2> >(tee "$out_dir/gpu-stderr.log" >&2)
rc=$?
set -e
if [[ $rc == 124 ]]; then
  echo "gpu-check: stopped at 7.5 minutes; $out_dir/gpu.json holds the sections that finished" >&2
fi
exit $rc
