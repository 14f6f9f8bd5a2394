//! Parameter, FLOP and cache counts of a [`ModelConfig`], from the config alone, and the size
//! rule [`ModelConfig::validate`] applies with them: at most [`MAX_ELEMENTS`] parameters and
//! RoPE table entries. The parameters are counted in closed form over the layers, as parts that
//! are each a constant times a product of config values (`Part`, `Factor`), with checked
//! arithmetic: a huge value is refused, naming the field that drives the size, instead of
//! wrapping. [`fits`](super::fits) names the same field when the weights exceed a device.

use serde::Serialize;

use super::config::{Attention, AttnGate, ModelConfig};
use super::ModelError;

/// The most parameters a config may have, and the most entries its RoPE tables may have: at
/// 8 bytes each (f64, the widest dtype a model is cast to) their bytes still fit the `i64`
/// sizes libtorch keeps, so no tensor dimension, element count or byte count can overflow.
/// [`ModelConfig::validate`] refuses configs past it, naming the field that drives the size.
pub const MAX_ELEMENTS: i64 = i64::MAX / 8;

/// Parameter counts from [`ModelConfig::param_counts`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ParamCounts {
    /// Every parameter.
    pub total: i64,
    /// Parameters one token touches (k routed experts, not E).
    pub active: i64,
    /// Embedding plus untied output head.
    pub embedding: i64,
}

impl ModelConfig {
    /// The parameter groups `MoePolicy::new` creates, in closed form over the layers: each is
    /// a constant times a product of config values, so a huge value is counted (and refused)
    /// without building or looping over anything.
    pub(crate) fn param_parts(&self) -> Vec<Part> {
        let f = Factor::field;
        let l = self.num_hidden_layers;
        let n_moe = self.n_moe_layers();
        let layers = f("num_hidden_layers", l);
        let layers_of = |n: i64, label| Factor::counted("num_hidden_layers", l, n.into(), label);
        let moe_layers = layers_of(n_moe, "MoE layers");
        let dense_layers = layers_of(l - n_moe, "dense layers");
        let latent_layers = layers_of(
            self.n_latent_layers(),
            "latent layers (num_hidden_layers / cla_factor)",
        );
        let cross_n = if self.cross_layer_residual { l - 1 } else { 0 };
        let cross_layers = layers_of(cross_n, "(num_hidden_layers - 1)");
        let d = f("hidden_size", self.hidden_size);
        let v_size = f("vocab_size", self.vocab_size);
        let h = f("num_attention_heads", self.num_attention_heads);
        let e = f("n_routed_experts", self.n_routed_experts);
        let ff = f("moe_intermediate_size", self.moe_intermediate_size);
        let part = Part::new;
        let mut parts = vec![part("the token embedding", 1, &[v_size, d]).embedding()];
        if !self.tie_word_embeddings {
            parts.push(part("the output head", 1, &[v_size, d]).embedding());
        }
        parts.push(part("the final norm", 1, &[d]));
        parts.push(part("the layer norms", 2, &[layers, d]));
        match self.attention {
            Attention::Mla => parts.extend(self.mla_parts(layers, latent_layers)),
            Attention::Gqa {
                num_key_value_heads,
                head_dim,
                qk_norm,
            } => {
                let g = f("attention.num_key_value_heads", num_key_value_heads);
                let hd = f("attention.head_dim", head_dim);
                parts.push(part("the query projections", 1, &[layers, h, hd, d]));
                parts.push(part(
                    "the key and value projections",
                    2,
                    &[layers, g, hd, d],
                ));
                parts.push(part(
                    "the attention output projections",
                    1,
                    &[layers, h, hd, d],
                ));
                if qk_norm {
                    parts.push(part("the query and key norms", 2, &[layers, hd]));
                }
            }
        }
        parts.push(part("the cross-layer residuals", 2, &[cross_layers, d]));
        parts.push(part("the routers", 1, &[moe_layers, e, d]));
        parts.push(part(
            "the shared experts",
            3,
            &[
                moe_layers,
                f("n_shared_experts", self.n_shared_experts),
                ff,
                d,
            ],
        ));
        parts.push(part("the routed experts", 3, &[moe_layers, e, d, ff]).routed());
        parts.push(part(
            "the dense FFNs",
            3,
            &[
                dense_layers,
                d,
                f("intermediate_size", self.intermediate_size),
            ],
        ));
        parts
    }

    /// The parameter groups of MLA attention over `layers` blocks, `latent_layers` of which
    /// own a latent.
    fn mla_parts(&self, layers: Factor, latent_layers: Factor) -> Vec<Part> {
        let f = Factor::field;
        let part = Part::new;
        let d = f("hidden_size", self.hidden_size);
        let h = f("num_attention_heads", self.num_attention_heads);
        let nope = f("qk_nope_head_dim", self.qk_nope_head_dim);
        let rope = f("qk_rope_head_dim", self.qk_rope_head_dim);
        let v = f("v_head_dim", self.v_head_dim);
        let c = f("kv_lora_rank", self.kv_lora_rank);
        let qk = Factor::sum(nope, rope, "(qk_nope_head_dim + qk_rope_head_dim)");
        let c_rope = Factor::sum(c, rope, "(kv_lora_rank + qk_rope_head_dim)");
        let mut parts = Vec::new();
        match self.q_lora_rank {
            None => parts.push(part("the query projections", 1, &[layers, h, qk, d])),
            Some(r) => {
                let r = f("q_lora_rank", r);
                parts.push(part("the low-rank query projections", 1, &[layers, r, d]));
                parts.push(part("the low-rank query norms", 1, &[layers, r]));
                parts.push(part("the query up-projections", 1, &[layers, h, qk, r]));
            }
        }
        if self.query_token_shift {
            match self.q_lora_rank {
                None => parts.push(part("the query shifts", 1, &[layers, h, qk, d])),
                Some(r) => parts.push(part(
                    "the query shifts",
                    1,
                    &[layers, f("q_lora_rank", r), d],
                )),
            }
        }
        match self.attn_gate {
            AttnGate::None => {}
            AttnGate::Headwise => parts.push(part("the attention gates", 1, &[layers, h, d])),
            AttnGate::Elementwise => parts.push(part("the attention gates", 1, &[layers, h, v, d])),
        }
        parts.push(part(
            "the key/value up-projections",
            1,
            &[
                layers,
                c,
                h,
                Factor::sum(nope, v, "(qk_nope_head_dim + v_head_dim)"),
            ],
        ));
        parts.push(part(
            "the attention output projections",
            1,
            &[layers, h, v, d],
        ));
        parts.push(part(
            "the latent projections",
            1,
            &[latent_layers, c_rope, d],
        ));
        parts.push(part("the latent norms", 1, &[latent_layers, c]));
        let taps = self.shift_taps() as i128;
        if taps > 0 {
            parts.push(part("the latent shifts", taps, &[latent_layers, c_rope, d]));
        }
        parts
    }

    /// Exact parameter counts, matching the variables `MoePolicy::new` creates (tested),
    /// computed with checked arithmetic. Refuses (naming the field that drives the size, with
    /// its value) a config that breaks a rule of [`ModelConfig::validate`] or whose count
    /// passes [`MAX_ELEMENTS`]; nothing overflows whatever the values.
    pub fn try_param_counts(&self) -> Result<ParamCounts, ModelError> {
        // The counting below relies on the signs and ranges these rules guarantee.
        self.validate_fields()?;
        let parts = self.param_parts();
        let max = i128::from(MAX_ELEMENTS);
        let k = i128::from(self.num_experts_per_tok);
        let e = i128::from(self.n_routed_experts);
        let (mut total, mut active, mut embedding) = (Some(0i128), Some(0i128), 0i128);
        for p in &parts {
            let n = p.count().filter(|&n| n <= max);
            total = total.zip(n).and_then(|(t, n)| t.checked_add(n));
            // k of the E routed experts per token (k < E, so this cannot exceed `n`).
            let n_active = match (p.routed, e) {
                (false, _) => n,
                // No experts: the routed part is empty.
                (true, 0) => Some(0),
                (true, e) => n.map(|n| n / e * k),
            };
            active = active.zip(n_active).and_then(|(a, n)| a.checked_add(n));
            if p.embedding {
                embedding += n.unwrap_or(0);
            }
        }
        match (total, active) {
            (Some(total), Some(active)) if total <= max => Ok(ParamCounts {
                total: total as i64,
                active: active as i64,
                embedding: embedding as i64,
            }),
            _ => {
                let approx: f64 = parts.iter().map(Part::approx).sum();
                let p = largest_part(&parts);
                let x = p.largest();
                Err(ModelError::InvalidConfig {
                    field: x.field,
                    value: x.value.to_string(),
                    why: format!(
                        "the model would have {approx:.3e} parameters, more than the \
                         {MAX_ELEMENTS} libtorch can size (their bytes must fit an i64); \
                         the largest part is {} ({} = {:.3e})",
                        p.what,
                        p.expr(),
                        p.approx()
                    ),
                })
            }
        }
    }

    /// [`ModelConfig::try_param_counts`] for a config that passed [`ModelConfig::validate`]
    /// (the presets, every parsed or loaded config). A config it refuses gets every count
    /// saturated at `i64::MAX` instead of a panic.
    pub fn param_counts(&self) -> ParamCounts {
        self.try_param_counts().unwrap_or(ParamCounts {
            total: i64::MAX,
            active: i64::MAX,
            embedding: i64::MAX,
        })
    }

    /// The RoPE tables are built in f64 on the CPU: `max_position_embeddings` positions times
    /// `qk_rope_head_dim / 2 + 1` entries must stay within [`MAX_ELEMENTS`].
    pub(crate) fn check_rope_size(&self) -> Result<(), ModelError> {
        let per_pos = i128::from(self.rope_dim() / 2 + 1);
        let n = i128::from(self.max_position_embeddings) * per_pos;
        if n > i128::from(MAX_ELEMENTS) {
            return Err(ModelError::InvalidConfig {
                field: "max_position_embeddings",
                value: self.max_position_embeddings.to_string(),
                why: format!(
                    "the RoPE tables would have {n} entries (max_position_embeddings x \
                     (qk_rope_head_dim / 2 + 1)), more than the {MAX_ELEMENTS} libtorch can size"
                ),
            });
        }
        Ok(())
    }

    /// Forward FLOPs per token at context `ctx`: 2·(active non-embedding params + head) plus
    /// the attention score/value products, 2·H·(d_qk + d_v)·ctx per layer (full attention over
    /// `ctx` earlier tokens; a training token averages ctx/2 under the causal mask).
    pub fn flops_per_token(&self, ctx: i64) -> f64 {
        let p = self.param_counts();
        // The embedding is a lookup (no FLOPs); the head matmul runs even when tied.
        let matmul_params =
            (p.active - p.embedding) as f64 + self.vocab_size as f64 * self.hidden_size as f64;
        let attn = 2.0 * self.mha_cache_elems_per_token_per_layer() as f64 * ctx as f64;
        2.0 * matmul_params + attn * self.num_hidden_layers as f64
    }

    /// Cached elements per token, summed over layers: latent + RoPE key per owning layer
    /// (MLA), or every key and value head per layer (GQA).
    pub fn cache_elems_per_token(&self) -> i64 {
        let (w1, w2) = self.cache_widths();
        self.n_latent_layers().saturating_mul(w1.saturating_add(w2))
    }

    /// Cached elements per token per layer for multi-head attention with the same head shape:
    /// a full K (d_qk) and V (d_v) for every query head.
    pub fn mha_cache_elems_per_token_per_layer(&self) -> i64 {
        let (qk, v) = match self.attention {
            Attention::Mla => (self.qk_head_dim(), self.v_head_dim),
            Attention::Gqa { head_dim, .. } => (head_dim, head_dim),
        };
        self.num_attention_heads
            .saturating_mul(qk.saturating_add(v))
    }

    /// MHA cache bytes per token per layer over ours (CLA sharing included).
    pub fn kv_ratio_vs_mha(&self) -> f64 {
        let ours_per_layer = self.cache_elems_per_token() as f64 / self.num_hidden_layers as f64;
        self.mha_cache_elems_per_token_per_layer() as f64 / ours_per_layer
    }
}

/// One factor of a parameter group: the config field errors name, its value, the number it
/// contributes (the MoE layers of `num_hidden_layers`, say, or `nope + rope`) and how the
/// group's formula shows it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Factor {
    pub(crate) field: &'static str,
    pub(crate) value: i64,
    n: i128,
    label: &'static str,
}

impl Factor {
    /// A config field as it is.
    fn field(field: &'static str, value: i64) -> Self {
        Self::counted(field, value, value.into(), field)
    }

    /// `n`, shown as `label`, derived from the field `field` of value `value`.
    fn counted(field: &'static str, value: i64, n: i128, label: &'static str) -> Self {
        Factor {
            field,
            value,
            n,
            label,
        }
    }

    /// `a + b` (two i64 fit an i128) shown as `label`, named after the larger.
    fn sum(a: Factor, b: Factor, label: &'static str) -> Self {
        let named = if b.n > a.n { b } else { a };
        Factor {
            n: a.n + b.n,
            label,
            ..named
        }
    }
}

/// A parameter group: `k` times the product of its factors.
#[derive(Clone, Debug)]
pub(crate) struct Part {
    pub(crate) what: &'static str,
    k: i128,
    factors: Vec<Factor>,
    /// Counted in [`ParamCounts::embedding`].
    embedding: bool,
    /// The routed experts: a token touches `num_experts_per_tok` of `n_routed_experts`.
    routed: bool,
}

impl Part {
    fn new(what: &'static str, k: i128, factors: &[Factor]) -> Self {
        Part {
            what,
            k,
            factors: factors.to_vec(),
            embedding: false,
            routed: false,
        }
    }

    fn embedding(self) -> Self {
        Part {
            embedding: true,
            ..self
        }
    }

    fn routed(self) -> Self {
        Part {
            routed: true,
            ..self
        }
    }

    /// The exact count; `None` past `i128`.
    fn count(&self) -> Option<i128> {
        if self.factors.iter().any(|f| f.n == 0) {
            return Some(0);
        }
        self.factors
            .iter()
            .try_fold(self.k, |acc, f| acc.checked_mul(f.n))
    }

    /// The count as a float (never overflows: a few factors below 2^64).
    pub(crate) fn approx(&self) -> f64 {
        self.factors
            .iter()
            .fold(self.k as f64, |acc, f| acc * f.n as f64)
    }

    /// The factor that drives the size: the largest.
    pub(crate) fn largest(&self) -> Factor {
        self.factors
            .iter()
            .copied()
            .max_by_key(|f| f.n)
            .unwrap_or(Factor::field("hidden_size", 0))
    }

    /// `num_hidden_layers x 3 x hidden_size x ...`.
    pub(crate) fn expr(&self) -> String {
        let mut names: Vec<String> = self.factors.iter().map(|f| f.label.to_string()).collect();
        if self.k != 1 {
            names.insert(1.min(names.len()), self.k.to_string());
        }
        names.join(" x ")
    }
}

/// The part with the most parameters.
pub(crate) fn largest_part(parts: &[Part]) -> &Part {
    parts
        .iter()
        .max_by(|a, b| a.approx().total_cmp(&b.approx()))
        .expect("a model has parts")
}

#[cfg(test)]
mod tests {
    use tch::{Device, Kind};

    use super::*;

    #[test]
    fn k3_cache_is_far_below_mha() {
        assert!(ModelConfig::k3_shape().kv_ratio_vs_mha() > 50.0);
    }

    /// The same counts as a per-layer loop in plain i64: the reference for small configs.
    fn loop_counts(cfg: &ModelConfig) -> ParamCounts {
        let d = cfg.hidden_size;
        let h = cfg.num_attention_heads;
        let (nope, rope, v) = (cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim);
        let c = cfg.kv_lora_rank;
        let q = match cfg.q_lora_rank {
            None => h * (nope + rope) * d,
            Some(r) => r * d + r + h * (nope + rope) * r,
        };
        let q_shift = match (cfg.query_token_shift, cfg.q_lora_rank) {
            (false, _) => 0,
            (true, None) => h * (nope + rope) * d,
            (true, Some(r)) => r * d,
        };
        let gate = match cfg.attn_gate {
            AttnGate::None => 0,
            AttnGate::Headwise => h * d,
            AttnGate::Elementwise => h * v * d,
        };
        let shift = cfg.shift_taps() as i64 * (c + rope) * d;
        let latent_a = (c + rope) * d + c + shift;
        let attn_common = match cfg.attention {
            Attention::Mla => q + q_shift + c * h * (nope + v) + d * h * v + gate + 2 * d,
            Attention::Gqa {
                num_key_value_heads: g,
                head_dim: e,
                qk_norm,
            } => 2 * h * e * d + 2 * g * e * d + if qk_norm { 2 * e } else { 0 } + 2 * d,
        };
        let (mut total, mut active) = (0i64, 0i64);
        let f = cfg.moe_intermediate_size;
        for i in 0..cfg.num_hidden_layers {
            let mut layer = attn_common;
            if cfg.owns_latent(i) && cfg.attention == Attention::Mla {
                layer += latent_a;
            }
            if cfg.cross_layer_residual && i > 0 {
                layer += 2 * d;
            }
            if cfg.is_moe_layer(i) {
                let router = cfg.n_routed_experts * d;
                let shared = 3 * d * f * cfg.n_shared_experts;
                let per_expert = 3 * d * f;
                total += layer + router + shared + cfg.n_routed_experts * per_expert;
                active += layer + router + shared + cfg.num_experts_per_tok * per_expert;
            } else {
                let dense = 3 * d * cfg.intermediate_size;
                total += layer + dense;
                active += layer + dense;
            }
        }
        let embed = cfg.vocab_size * d;
        let head = if cfg.tie_word_embeddings { 0 } else { embed };
        ParamCounts {
            total: total + embed + head + d,
            active: active + embed + head + d,
            embedding: embed + head,
        }
    }

    #[test]
    fn closed_form_counts_match_the_per_layer_loop() {
        let mut cfgs: Vec<ModelConfig> = ["tiny", "small", "k3-shape", "gpu-1b"]
            .iter()
            .map(|p| ModelConfig::preset(p).unwrap())
            .collect();
        cfgs.extend([
            ModelConfig {
                latent_token_shift: true,
                latent_shift_taps: 3,
                query_token_shift: true,
                q_lora_rank: Some(24),
                tie_word_embeddings: false,
                attn_gate: AttnGate::None,
                ..ModelConfig::tiny()
            },
            ModelConfig {
                cla_factor: 3,
                num_hidden_layers: 7,
                first_k_dense_replace: 2,
                n_shared_experts: 0,
                cross_layer_residual: false,
                latent_token_shift: true,
                ..ModelConfig::small()
            },
            ModelConfig {
                num_hidden_layers: 1,
                first_k_dense_replace: 1,
                qk_rope_head_dim: 0,
                ..ModelConfig::tiny()
            },
        ]);
        cfgs.extend(gqa_configs());
        for cfg in cfgs {
            assert_eq!(
                cfg.try_param_counts().unwrap(),
                loop_counts(&cfg),
                "{cfg:?}"
            );
            assert_eq!(cfg.param_counts(), loop_counts(&cfg));
        }
    }

    /// Grouped-query configs: Qwen3-MoE-like with dense layers picked by `mlp_only_layers`
    /// and `decoder_sparse_step`, and a dense Qwen3-like one.
    pub(crate) fn gqa_configs() -> Vec<ModelConfig> {
        let gqa = ModelConfig {
            attention: Attention::Gqa {
                num_key_value_heads: 2,
                head_dim: 24,
                qk_norm: true,
            },
            attn_gate: AttnGate::None,
            num_hidden_layers: 7,
            n_shared_experts: 0,
            mlp_only_layers: vec![2, 5, 5],
            decoder_sparse_step: 2,
            first_k_dense_replace: 1,
            ..ModelConfig::tiny()
        };
        vec![
            gqa.clone(),
            ModelConfig {
                decoder_sparse_step: 1,
                mlp_only_layers: vec![0],
                first_k_dense_replace: 0,
                tie_word_embeddings: false,
                ..gqa.clone()
            },
            ModelConfig {
                n_routed_experts: 0,
                attention: Attention::Gqa {
                    num_key_value_heads: 4,
                    head_dim: 16,
                    qk_norm: false,
                },
                ..gqa
            },
        ]
    }

    #[test]
    fn moe_layers_follow_the_sparse_step_and_the_dense_list() {
        let [a, b, dense] = &gqa_configs()[..] else {
            panic!("three configs")
        };
        // Past layer 0, layers 1, 3, 5 are on the step of 2; 5 is kept dense.
        let moe = |c: &ModelConfig| (0..7).filter(|&i| c.is_moe_layer(i)).collect::<Vec<_>>();
        assert_eq!(moe(a), [1, 3]);
        assert_eq!(a.n_moe_layers(), 2);
        assert_eq!(moe(b), [1, 2, 3, 4, 5, 6]);
        assert_eq!(b.n_moe_layers(), 6);
        assert_eq!(moe(dense), Vec::<i64>::new());
        assert_eq!(dense.n_moe_layers(), 0);
        // GQA caches every key and value head of every layer.
        assert_eq!(a.cache_elems_per_token(), 7 * 2 * 2 * 24);
    }

    /// A config whose `field` is `value` (serde, so any field by name).
    fn with(field: &str, value: serde_json::Value) -> ModelConfig {
        let mut v = serde_json::to_value(ModelConfig::tiny()).unwrap();
        v[field] = value;
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn absurd_sizes_are_refused_naming_the_field() {
        const HUGE: i64 = 1 << 62;
        for (field, value, named) in [
            ("vocab_size", HUGE, "vocab_size"),
            ("vocab_size", i64::MAX, "vocab_size"),
            ("hidden_size", HUGE, "hidden_size"),
            ("hidden_size", 1 << 52, "hidden_size"),
            ("n_routed_experts", HUGE, "n_routed_experts"),
            ("n_routed_experts", 1 << 50, "n_routed_experts"),
            ("moe_intermediate_size", HUGE, "moe_intermediate_size"),
            ("num_hidden_layers", HUGE, "num_hidden_layers"),
            ("num_hidden_layers", i64::MAX, "num_hidden_layers"),
            ("num_attention_heads", HUGE, "num_attention_heads"),
            ("kv_lora_rank", i64::MAX, "kv_lora_rank"),
            ("qk_nope_head_dim", i64::MAX, "qk_nope_head_dim"),
            ("qk_rope_head_dim", HUGE, "qk_rope_head_dim"),
            ("v_head_dim", i64::MAX, "v_head_dim"),
            ("n_shared_experts", HUGE, "n_shared_experts"),
            ("max_position_embeddings", HUGE, "max_position_embeddings"),
            (
                "max_position_embeddings",
                i64::MAX,
                "max_position_embeddings",
            ),
        ] {
            let cfg = with(field, value.into());
            let Err(err) = cfg.validate() else {
                panic!("{field} = {value} passed");
            };
            let msg = err.to_string();
            assert!(
                msg.contains(&format!("{named} = {value}")),
                "{field} = {value}: {msg}"
            );
            if field != "max_position_embeddings" {
                assert!(msg.contains("parameters"), "{msg}");
                let err = cfg.try_param_counts().unwrap_err().to_string();
                assert!(err.contains(named), "{err}");
            }
            // Nothing panics on a refused config: the counts saturate.
            let _ = (cfg.param_counts(), cfg.flops_per_token(i64::MAX));
            let _ = (cfg.cache_elems_per_token(), cfg.kv_ratio_vs_mha());
            assert!(cfg.build_bytes(Kind::Float).is_err());
            assert!(cfg.check_fits(Device::Cpu, Kind::Float).is_err());
        }
        // A dense FFN width only counts where there are dense layers.
        let cfg = ModelConfig {
            intermediate_size: HUGE,
            ..ModelConfig::tiny()
        };
        cfg.validate().unwrap();
        let msg = ModelConfig {
            first_k_dense_replace: 1,
            ..cfg
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(
            msg.contains(&format!("intermediate_size = {HUGE}")),
            "{msg}"
        );
        assert!(msg.contains("the dense FFNs"), "{msg}");
    }
}
