//! corvid-model: the MoE policy network on tch. Latent attention (MLA) with gating and
//! cross-layer sharing or grouped-query attention with q/k norms, balanced sparse experts,
//! cached decoding, the CPU and CUDA decode kernels, the safetensors checkpoint format, and
//! Hugging Face checkpoints of DeepSeek-V3, Qwen3-MoE and Qwen3 ([`arch`]). It knows no tasks, stores, tokenizers or
//! networks: the actor and the learner both build it from a [`ModelConfig`].
//!
//! # Brief overview
//!
//! - [`ModelConfig`] (serde/TOML; presets `tiny`, `small`, `k3-shape`, `gpu-1b`) fixes every shape and
//!   option; [`ModelConfig::validate`] names the bad field and value, and refuses a model past
//!   libtorch's sizes (parameters counted with checked arithmetic, [`accounting`]).
//!   [`ModelConfig::check_fits`] ([`fits`]), which [`MoePolicy::new`] runs before it allocates
//!   anything, refuses one whose weights exceed the memory of its device.
//! - [`MoePolicy`] is the decoder-only transformer. [`MoePolicy::trunk`] (or
//!   [`MoePolicy::trunk_packed`] for packed documents) runs a batch `[B, T]` and returns the
//!   final hidden states, the balance loss, per-layer [`MoeHealth`] and the [`BalanceStats`]
//!   that [`MoePolicy::update_balance`] consumes after each optimizer step; with
//!   [`Checkpoint::Blocks`] each block is rerun in [`MoePolicy::backward`] instead of kept.
//!   [`head`] is the logits boundary: log-probs, entropy and their gradients a chunk of
//!   positions at a time, never `[T, V]` logits; [`causal`] keeps attention within rows or
//!   packed documents without a `[T, T]` mask. [`MoePolicy::forward`] (full logits
//!   `[B, T, V]`) is the reference path and what `corvid model logits` prints.
//! - [`routes`] is routing replay: [`MoePolicy::forward_ragged_last_routed`] records the expert
//!   ids the actor chose; [`MoePolicy::trunk_routed`] compares the learner's own choice with
//!   given ids ([`RouteAgreement`]) or routes by them, gating by its own scores.
//! - [`KvCache`] holds only the latent and the RoPE key per token (MLA), or every key and
//!   value head (grouped-query attention, [`gqa`]);
//!   [`MoePolicy::forward_cached`] appends tokens to every sequence of a batch (prefill, a new
//!   turn, or one decode step) using the absorbed attention; [`MoePolicy::forward_ragged`] lets
//!   each row append its own number of tokens (the actor's batched prefill and decode).
//!   Sampling is the caller's: the actor draws with its own nucleus sampler.
//! - `latent_token_shift` (off in the presets, on in the demo) feeds each token's previous
//!   layer input into its latent and RoPE key ("smeared keys"), which lets a single layer copy
//!   by content; `latent_shift_taps` (1–4, the demo uses 2) reaches that many tokens back,
//!   each tap through its own projection, so a key can also carry the marker before a value.
//!   The cache then also keeps each row's last `taps` inputs per latent layer.
//!   `query_token_shift` does the same for the query with the previous input ("smeared
//!   queries"), so a first-layer query knows the two tokens it copies after and a doubled
//!   letter no longer matches two keys.
//! - [`checkpoint`] saves and loads a policy folder (safetensors plus `config.json`, every file
//!   written whole and fsynced), and turns the weights into bytes and back for streaming to
//!   actors.
//! - [`precision`] casts the weights to bf16 for CUDA with the routers kept in fp32
//!   ([`MoePolicy::new_in_kind`]); [`cuda`] holds the custom CUDA kernels (absorbed MLA
//!   decode, MoE dispatch/combine) and their checks; [`mla_cpu`] the fused CPU decode core.
//!   The benchmarks that time them live with the `corvid bench` commands that run them.
//!
//! Files, bottom-up: `config` (schema, validation) with `presets`, `accounting` (counts, the
//! size rule) and `fits` (device memory) →
//! `rope`, `layers` → `attention` (MLA + gate), `gqa`, `cross_layer` → `router`, `experts`,
//! `balance`, `health`, `routes` → `moe` → `cache`, `causal` → `policy` (blocks, the decoder, the
//! training trunk) → `head` →
//! `checkpoint` → `arch` (Hugging Face configs, state-dict adapters, export). `docs/model.md` explains the shapes.
//!
//! ```
//! use corvid_model::{ModelConfig, MoePolicy};
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
//! // Cached decoding: prefill, then one greedy step for both sequences.
//! let mut cache = model.new_cache(2, 32);
//! let logits = model.forward_cached(&mut cache, &tokens)?;
//! let next = logits.select(1, 15).argmax(-1, false);
//! let _ = model.forward_cached(&mut cache, &next.unsqueeze(1))?;
//! assert_eq!(cache.lens(), &[17, 17]);
//! # Ok::<(), corvid_model::ModelError>(())
//! ```
#![deny(missing_docs)]

pub mod accounting;
pub mod arch;
pub mod attention;
pub mod balance;
pub mod cache;
pub mod causal;
pub mod checkpoint;
pub mod config;
pub mod cross_layer;
pub mod cuda;
mod error;
pub mod experts;
pub mod fits;
pub mod gqa;
pub mod head;
pub mod health;
pub mod layers;
pub mod mla_cpu;
pub mod moe;
pub mod policy;
pub mod precision;
mod presets;
pub mod rope;
pub mod router;
pub mod routes;

pub use accounting::ParamCounts;
pub use attention::DecodeCore;
pub use cache::KvCache;
pub use checkpoint::{load_weights_from_bytes, weights_to_bytes};
pub use config::{
    Attention, AttnGate, BalanceMode, ExpertAct, ExpertDispatch, ModelConfig, RopeScaling,
    ScoreFunc,
};
pub use error::ModelError;
pub use fits::BuildBytes;
pub use head::TokenScores;
pub use health::MoeHealth;
pub use policy::{
    BalanceStats, Checkpoint, ForwardOutput, MoePolicy, Trunk, DEFAULT_RECOMPUTE_SLICE_TOKENS,
};
pub use precision::weight_kind_for;
pub use routes::{RouteAgreement, RouteOpts};
