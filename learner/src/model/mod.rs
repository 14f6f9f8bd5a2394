//! The MoE policy model: latent attention with gating and cross-layer sharing, balanced sparse
//! experts, cached decoding.
//!
//! # Brief overview
//!
//! - [`ModelConfig`] (serde/TOML; presets `tiny`, `small`, `k3-shape`, `gpu-1b`) fixes every shape and
//!   option; [`ModelConfig::validate`] names the bad field and value, and refuses a model past
//!   libtorch's sizes (parameters counted with checked arithmetic).
//!   [`ModelConfig::check_fits`], which [`MoePolicy::new`] runs before it allocates anything,
//!   refuses one whose weights exceed the memory of its device.
//! - [`MoePolicy`] is the decoder-only transformer. [`MoePolicy::forward`] runs a packed batch
//!   `[B, T]` and returns logits `[B, T, V]`, the balance loss, per-layer [`MoeHealth`] and the
//!   [`BalanceStats`] that [`MoePolicy::update_balance`] consumes after each optimizer step.
//!   [`MoePolicy::token_logprobs`] gives per-token log-probs of target tokens (for RL).
//! - [`KvCache`] holds only the latent and the RoPE key per token;
//!   [`MoePolicy::forward_cached`] appends tokens to every sequence of a batch (prefill, a new
//!   turn, or one decode step) using the absorbed attention; [`MoePolicy::forward_ragged`] lets
//!   each row append its own number of tokens (the actor's batched prefill and decode).
//!   [`fn@sample`] draws the next token with temperature and top-p and returns its log-prob.
//! - `latent_token_shift` (off in the presets, on in the demo) feeds each token's previous
//!   layer input into its latent and RoPE key ("smeared keys"), which lets a single layer copy
//!   by content; `latent_shift_taps` (1–4, the demo uses 2) reaches that many tokens back,
//!   each tap through its own projection, so a key can also carry the marker before a value.
//!   The cache then also keeps each row's last `taps` inputs per latent layer.
//!   `query_token_shift` does the same for the query with the previous input ("smeared
//!   queries"), so a first-layer query knows the two tokens it copies after and a doubled
//!   letter no longer matches two keys.
//! - [`checkpoint`] saves and loads safetensors plus `config.json`, and turns the weights into
//!   bytes and back for streaming to actors.
//! - [`precision`] casts the weights to bf16 for CUDA with the routers kept in fp32
//!   ([`MoePolicy::new_in_kind`]); [`cuda`] holds the custom CUDA kernels (absorbed MLA
//!   decode, MoE dispatch/combine), their checks and the GPU benchmark.
//!
//! Files, bottom-up: `config` → `rope`, `layers` → `attention` (MLA + gate), `cross_layer` →
//! `router`, `experts`, `balance`, `health` → `moe` → `cache` → `model` → `sample`,
//! `checkpoint`. `docs/model.md` explains the shapes.
//!
//! ```
//! use corvid_learner::model::{sample, ModelConfig, MoePolicy, SamplingParams};
//! use tch::{nn, Device, Kind, Tensor};
//!
//! tch::set_num_threads(1);
//! let cfg = ModelConfig { num_hidden_layers: 2, ..ModelConfig::tiny() };
//! let vs = nn::VarStore::new(Device::Cpu);
//! let model = MoePolicy::new(&vs.root(), &cfg)?;
//!
//! // Training forward over a packed batch.
//! let tokens = Tensor::randint(cfg.vocab_size, [2, 16], (Kind::Int64, Device::Cpu));
//! let out = model.forward(&tokens, true)?;
//! assert_eq!(out.logits_btv.size(), [2, 16, cfg.vocab_size]);
//! assert_eq!(out.health.len(), 2);
//!
//! // Cached decoding: prefill, then one step for both sequences.
//! let mut cache = model.new_cache(2, 32);
//! let logits = model.forward_cached(&mut cache, &tokens)?;
//! let last = logits.select(1, 15);
//! let (next, logp) = sample(&last, SamplingParams { temperature: 1.0, top_p: 0.9 })?;
//! let _ = model.forward_cached(&mut cache, &next.unsqueeze(1))?;
//! assert_eq!(cache.lens(), &[17, 17]);
//! assert!(logp.max().double_value(&[]) <= 0.0);
//! # Ok::<(), corvid_learner::model::ModelError>(())
//! ```

pub mod attention;
pub mod balance;
pub mod bench;
pub mod cache;
pub mod checkpoint;
pub mod config;
pub mod cross_layer;
pub mod cuda;
pub mod experts;
pub mod health;
pub mod layers;
pub mod mla_cpu;
#[allow(clippy::module_inception)]
pub mod model;
pub mod moe;
pub mod precision;
pub mod rope;
pub mod router;
pub mod sample;

pub use attention::DecodeCore;
pub use cache::KvCache;
pub use config::{
    AttnGate, BalanceMode, BuildBytes, ExpertAct, ExpertDispatch, ModelConfig, ParamCounts,
    RopeScaling, ScoreFunc,
};
pub use health::MoeHealth;
pub use model::{BalanceStats, ForwardOutput, MoePolicy};
pub use sample::{sample, SamplingParams};

/// Everything that can go wrong building, running or loading the model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// `ModelConfig::preset` got an unknown name.
    #[error("unknown model preset `{0}` (expected tiny, small, k3-shape or gpu-1b)")]
    UnknownPreset(String),
    /// A config file did not parse.
    #[error("model config does not parse: {0}")]
    ConfigParse(String),
    /// A config field has a bad value.
    #[error("invalid model config: {field} = {value}: {why}")]
    InvalidConfig {
        /// The field.
        field: &'static str,
        /// Its value.
        value: String,
        /// The rule it breaks.
        why: String,
    },
    /// The config's weights cannot fit the memory of the device it is built on (checked
    /// before anything is allocated, [`ModelConfig::check_fits`]).
    #[error("model config too large for {device}: {detail}")]
    TooLarge {
        /// The device (`cpu`, `cuda:0`).
        device: String,
        /// The config field that drives the size.
        field: &'static str,
        /// The size, the limit, where the limit comes from and the largest part.
        detail: String,
    },
    /// The model's device does not exist.
    #[error("model device: {0}")]
    Device(String),
    /// Bad input to a forward or sampler (shapes, token ids, positions).
    #[error("model input: {0}")]
    Input(String),
    /// A checkpoint tensor is missing, truncated or mismatched.
    #[error("checkpoint tensor `{tensor}`: {problem}")]
    Checkpoint {
        /// The tensor name (or `<header>`).
        tensor: String,
        /// What is wrong.
        problem: String,
    },
    /// Reading or writing a checkpoint file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// libtorch reported an error.
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
    /// A custom CUDA kernel could not run (no CUDA, or bad inputs).
    #[error("CUDA kernel: {0}")]
    Cuda(#[from] cuda::CudaError),
}
