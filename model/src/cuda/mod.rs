//! Custom CUDA kernels, compiled at run time with NVRTC and launched through the driver API
//! (both loaded dynamically by `cudarc`, so CPU-only builds compile and run; the kernels then
//! return [`CudaError::Unavailable`]).
//!
//! # Brief overview
//!
//! - [`MlaDecode`]: absorbed MLA decode attention over the latent cache (one query token per
//!   row): `softmax(scale·(q_lat·c_kvᵀ + q_pe·k_peᵀ))·c_kv` with per-row valid lengths, in
//!   bf16 (tensor cores, keys split across blocks) or fp32 (plain FMA).
//!   [`MlaDecode::reference`] computes the same with ATen ops, in the order of
//!   [`Mla::forward_absorbed`](super::attention::Mla::forward_absorbed).
//! - [`DispatchPlan`]: MoE token dispatch (rows permuted by expert into groups padded to 16
//!   bytes of rows, the offsets `_grouped_mm` takes) and combine (un-permute and weight, f32
//!   accumulation, no atomics), with ATen references.
//! - [`check`]: every kernel against its reference on fresh random inputs, outputs poisoned
//!   with NaN first, within bf16 / fp32 tolerance.
//!
//! Kernels run on the null stream of the device's primary context: the stream and context
//! libtorch uses when nothing set another (tch never does), so they are ordered with ATen work
//! and with the caching allocator. Inputs are the tensors' own device pointers
//! (`Tensor::data_ptr`); nothing is copied to the host.
//!
//! Libraries: `libcuda.so.1` comes with the driver (libtorch has it loaded already when
//! `tch::Cuda::is_available()`); `libnvrtc.so.13` ships in the PyTorch wheel's
//! `nvidia/cu13/lib`, which is found from libtorch's own location when it is not on the
//! library path (see [`runtime`]).

pub mod check;
mod mla_decode;
mod moe_dispatch;
pub mod runtime;

pub(crate) use mla_decode::slot_rows;
pub use mla_decode::{MlaDecode, MlaKernel};
pub use moe_dispatch::DispatchPlan;
pub use runtime::{availability, compile_all};

/// What the CUDA kernels can report instead of a result.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// No usable CUDA device, driver or NVRTC in this process.
    #[error("CUDA is not available: {0}")]
    Unavailable(String),
    /// An argument has the wrong shape, dtype or device; the message names it.
    #[error("{0}")]
    Input(String),
    /// NVRTC rejected a kernel source (the log is NVRTC's).
    #[error("NVRTC could not compile {kernel}: {log}")]
    Compile {
        /// Which source.
        kernel: String,
        /// NVRTC's log or error.
        log: String,
    },
    /// A CUDA driver call failed.
    #[error("CUDA driver: {0}")]
    Driver(String),
    /// libtorch reported an error.
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
}

impl From<cudarc::driver::DriverError> for CudaError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        CudaError::Driver(e.to_string())
    }
}
