//! `corvid model`: inspect a model (a preset, a model TOML or a Hugging Face folder), run a
//! Hugging Face checkpoint (logits, generation) and export one.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};

mod hf;
mod info;

/// inspect, run and export models: presets, model TOMLs and Hugging Face folders.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  corvid model info --preset tiny
  corvid model info --preset k3-shape --context 32768 --json
  corvid model info --config configs/model/tiny.toml
  corvid model info --model path/to/hf-folder
  corvid model logits --model path/to/hf-folder --ids 1,2,3 --json
  corvid model score --model path/to/hf-folder --ids-file ids.txt --temperature 0.7 --json
  corvid model generate --model path/to/hf-folder --ids 1,2,3 --max-new-tokens 32 --greedy --json
  corvid model export --model path/to/hf-folder --out path/to/new-folder --dtype bf16")]
pub struct ModelArgs {
    #[command(subcommand)]
    which: ModelCommand,
}

#[derive(Subcommand, Debug)]
enum ModelCommand {
    /// Total and active parameters, FLOPs per token and cache bytes per token.
    Info(info::InfoArgs),
    /// fp32 logits at every position of a token sequence (a Hugging Face folder).
    Logits(hf::LogitsArgs),
    /// Per position, the log-prob of the next id and the entropy, through the training path
    /// (chunked logits; a model folder).
    Score(hf::ScoreArgs),
    /// Generate tokens with cached decoding (a Hugging Face folder).
    Generate(hf::GenerateArgs),
    /// Write a Hugging Face folder's model as a new checkpoint `from_pretrained` reads.
    Export(hf::ExportArgs),
}

/// A model folder: a Hugging Face checkpoint (`config.json` with a `model_type`, safetensors
/// weights) or a policy folder a run wrote (a checkpoint, `ref/`).
#[derive(Args, Debug)]
struct ModelDir {
    /// The Hugging Face folder or policy folder.
    #[arg(long, value_name = "DIR")]
    model: PathBuf,
}

/// Runs the command.
pub fn run(args: ModelArgs) -> anyhow::Result<ExitCode> {
    match args.which {
        ModelCommand::Info(a) => info::run(a),
        ModelCommand::Logits(a) => hf::logits(a),
        ModelCommand::Score(a) => hf::score(a),
        ModelCommand::Generate(a) => hf::generate(a),
        ModelCommand::Export(a) => hf::export(a),
    }
}
