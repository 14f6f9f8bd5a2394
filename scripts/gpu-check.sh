#!/usr/bin/env bash
# The one GPU check (issue 9): runs the carried release binary's `corvid bench gpu` on a machine
# with a CUDA GPU and PyTorch (the lent H200 image: PyTorch 2.11.0+cu130, no Rust), prints the
# table last and leaves the JSON report in $OUT/gpu.json (or ./gpu.json without $OUT).
#
# The binary was linked on the CPU machine against the PyTorch wheel's libtorch, found there
# through RUNPATH entries relative to the binary ($ORIGIN/../../.corvid/torch/lib, see
# .cargo/config.toml). On the GPU machine .corvid/torch is absent (it is a link into a local
# cache), so this script points the loader at the image's own torch/lib with LD_LIBRARY_PATH,
# which takes precedence over RUNPATH: libtorch_cpu.so, libtorch_cuda.so (kept in the
# binary's DT_NEEDED by scripts/link-torch-gcc, so CUDA is detected), libc10*.so and the CUDA
# 13 libraries of the nvidia-* wheels next to it. NVRTC (libnvrtc.so.13, for the custom
# kernels) is in <site-packages>/nvidia/cu13/lib; it is put on the path too (the binary would
# also find it from libtorch's location). libcuda.so.1 comes from the driver.
#
# Usage: scripts/gpu-check.sh [extra `corvid bench gpu` flags]
# Budget: well under 8 minutes on one H200 (the bench stops nothing itself; `timeout` below
# cuts it at 7.5 minutes so the JSON written after each finished section still comes back).
set -euo pipefail
cd "$(dirname "$0")/.."

bin=target/release/corvid
if [[ ! -x $bin ]]; then
  echo "gpu-check: $bin is missing; build it on the CPU machine (cargo build --release --bin corvid) and carry it" >&2
  exit 2
fi
py=${PYTHON:-python3}
torch_dir=$("$py" -c 'import torch, os; print(os.path.dirname(torch.__file__))') || {
  echo "gpu-check: $py cannot import torch" >&2
  exit 2
}
site=$(dirname "$torch_dir")
libs="$torch_dir/lib"
for d in "$site"/nvidia/cu13/lib "$site"/nvidia/*/lib; do
  [[ -d $d ]] && libs="$libs:$d"
done
export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LIBTORCH="$torch_dir"
# One process owns the GPU; libtorch's CPU threads only feed it.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}

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
