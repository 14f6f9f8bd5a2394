//! `corvid model info`: parameters, FLOPs and cache size per token of a preset, a model TOML or
//! a Hugging Face folder.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use corvid_model::{arch, ModelConfig};

/// Arguments of `corvid model info`.
#[derive(Args, Debug)]
pub(super) struct InfoArgs {
    /// Preset: tiny, small, k3-shape or gpu-1b.
    #[arg(long, default_value = "tiny", conflicts_with_all = ["config", "model"])]
    preset: String,
    /// A model config TOML file (fields missing from it default to `tiny`).
    #[arg(long, conflicts_with = "model")]
    config: Option<PathBuf>,
    /// A Hugging Face folder (its `config.json`; no weights are read).
    #[arg(long, value_name = "DIR")]
    model: Option<PathBuf>,
    /// Context length at which attention FLOPs per token are counted.
    #[arg(long, default_value_t = 4096)]
    context: i64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs the command.
pub(super) fn run(a: InfoArgs) -> anyhow::Result<ExitCode> {
    let (name, cfg) = match (&a.model, &a.config) {
        (Some(dir), _) => {
            let hf = arch::read_config(dir)?;
            (
                format!("{} ({})", dir.display(), hf.family.model_type()),
                hf.model,
            )
        }
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let cfg = ModelConfig::from_toml(&text)
                .with_context(|| format!("model config {}", path.display()))?;
            (path.display().to_string(), cfg)
        }
        (None, None) => (a.preset.clone(), ModelConfig::preset(&a.preset)?),
    };
    let p = cfg.param_counts();
    let bf16 = 2;
    let cache = cfg.cache_elems_per_token() * bf16;
    let mha = cfg.mha_cache_elems_per_token_per_layer() * cfg.num_hidden_layers * bf16;
    let info = serde_json::json!({
        "model": name,
        "params_total": p.total,
        "params_active": p.active,
        "params_embedding": p.embedding,
        "context": a.context,
        "flops_per_token_forward": cfg.flops_per_token(a.context),
        "flops_per_token_train": 3.0 * cfg.flops_per_token(a.context),
        "cache_bytes_per_token_bf16": cache,
        "mha_cache_bytes_per_token_bf16": mha,
        "kv_bytes_ratio_vs_mha": cfg.kv_ratio_vs_mha(),
        "config": cfg,
    });
    if a.json {
        println!("{info}");
        return Ok(ExitCode::SUCCESS);
    }
    let m = |x: i64| format!("{:.2}M", x as f64 / 1e6);
    println!("model {name}");
    println!(
        "  layers {}  hidden {}  heads {}  experts {} (top-{}, {} shared)  vocab {}",
        cfg.num_hidden_layers,
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.n_routed_experts,
        cfg.num_experts_per_tok,
        cfg.n_shared_experts,
        cfg.vocab_size
    );
    println!(
        "  parameters      total {}  active {}  (embedding {})",
        m(p.total),
        m(p.active),
        m(p.embedding)
    );
    println!(
        "  FLOPs/token     forward {:.3e}  train {:.3e}  (at context {})",
        cfg.flops_per_token(a.context),
        3.0 * cfg.flops_per_token(a.context),
        a.context
    );
    let (w1, w2) = cfg.cache_widths();
    let per_layer = match cfg.attention {
        corvid_model::Attention::Mla => format!(
            "latent {w1} + rope {w2} x {} latent layers",
            cfg.n_latent_layers()
        ),
        corvid_model::Attention::Gqa { .. } => {
            format!("keys {w1} + values {w2} x {} layers", cfg.n_latent_layers())
        }
    };
    println!(
        "  cache/token     {cache} B bf16 ({per_layer}); MHA same heads: {mha} B; ratio {:.1}x",
        cfg.kv_ratio_vs_mha()
    );
    Ok(ExitCode::SUCCESS)
}
