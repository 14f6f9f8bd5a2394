//! Helpers shared by the decode-attention tests (`cuda_kernels.rs`, `cpu_decode.rs`).

use corvid_model::cuda::MlaDecode;
use tch::{Device, Kind, Tensor};

/// Largest absolute difference, computed in f64.
pub fn max_abs(a: &Tensor, b: &Tensor) -> f64 {
    (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[])
}

/// Random inputs of one decode-attention problem on the CPU: one row per entry of `lens`,
/// `h` heads, a cache of `cap` slots of which the first `s` are passed (a narrowed cache, as
/// the model passes it; `cap == s` gives plain contiguous tensors), latent width `c`, RoPE
/// width `r`.
pub struct DecodeInputs {
    pub q_lat: Tensor,
    pub q_pe: Tensor,
    pub c_kv: Tensor,
    pub k_pe: Tensor,
    pub lens: Tensor,
}

impl DecodeInputs {
    pub fn new(h: i64, s: i64, cap: i64, c: i64, r: i64, lens: &[i64], kind: Kind) -> Self {
        let b = lens.len() as i64;
        let f = (kind, Device::Cpu);
        DecodeInputs {
            q_lat: Tensor::randn([b, h, c], f),
            q_pe: Tensor::randn([b, h, r], f),
            c_kv: Tensor::randn([b, cap, c], f).narrow(1, 0, s),
            k_pe: Tensor::randn([b, cap, r], f).narrow(1, 0, s),
            lens: Tensor::from_slice(lens),
        }
    }

    /// The problem over these inputs with softmax scale `scale`.
    pub fn problem(&self, scale: f64) -> MlaDecode<'_> {
        MlaDecode {
            q_lat_bhc: &self.q_lat,
            q_pe_bhr: &self.q_pe,
            c_kv_bsc: &self.c_kv,
            k_pe_bsr: &self.k_pe,
            lens_b: &self.lens,
            scale,
        }
    }
}
