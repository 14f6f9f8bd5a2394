# Sourced by the GPU scripts (gpu-check.sh, gpu-long.sh), from the repository root: checks
# the carried release binary ($bin) and points the loader at the GPU image's libtorch.
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
bin=target/release/corvid
if [[ ! -x $bin ]]; then
  echo "gpu-env: $bin is missing; build it on the CPU machine (cargo build --release --bin corvid) and carry it" >&2
  exit 2
fi
py=${PYTHON:-python3}
torch_dir=$("$py" -c 'import torch, os; print(os.path.dirname(torch.__file__))') || {
  echo "gpu-env: $py cannot import torch" >&2
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

