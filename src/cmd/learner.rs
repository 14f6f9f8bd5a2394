//! `corvid learner`: serve tasks and weights to actors, ingest trajectories and train.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use corvid_learner::config::LearnerConfig;
use corvid_learner::learner::{self, LearnerOptions};

/// serve tasks and weights to actors, ingest trajectories and train.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  corvid learner --config configs/demo.toml
  corvid learner --config configs/demo.toml --listen 127.0.0.1:50051 --run-dir runs/demo
  corvid learner --config configs/demo.toml --listen 127.0.0.1:50052 --prometheus 127.0.0.1:9465 \
      --run-dir runs/second                                  a second learner on this machine
  corvid learner --config configs/demo.toml --resume      continue from the newest checkpoint
  corvid learner --config learner.toml --resume-if-any     resume when there is a checkpoint (a restarted pod)

The run folder holds store/ (trajectories), ckpt/ (run checkpoints), ref/ (the SFT
reference policy), metrics/metrics.jsonl, config.toml (the resolved config) and token
(the shared token actors read with --token-file; created when absent).
SIGTERM or ctrl-c writes a checkpoint and exits cleanly.
The gRPC port also answers the standard health protocol (grpc.health.v1, no token):
\"corvid.v1.Learner\" is SERVING once a policy is published (after SFT) and NOT_SERVING
while the learner stops; \"\" is the process as a whole.")]
pub struct LearnerArgs {
    /// The learner's TOML config (see configs/demo.toml for every field and its default).
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// gRPC listen address; overrides `listen` in the config.
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Prometheus /metrics address; overrides `[metrics] prometheus` in the config ("" = off).
    #[arg(long, value_name = "ADDR")]
    prometheus: Option<String>,
    /// Run folder; overrides `run_dir` in the config (default runs/<run_name>).
    #[arg(long, value_name = "DIR")]
    run_dir: Option<PathBuf>,
    /// Continue from the newest checkpoint in the run folder (model, optimizer,
    /// curriculum, RNG, store cursor, step). Without it, a run folder that already has
    /// checkpoints is refused, so a run is never overwritten by accident.
    #[arg(long, conflicts_with = "resume_if_any")]
    resume: bool,
    /// Continue from the newest checkpoint when the run folder has one, else start a new
    /// run: for a process restarted in place (a Kubernetes pod on its volume).
    #[arg(long)]
    resume_if_any: bool,
}

/// The config file with the command-line overrides applied.
fn resolve(args: &LearnerArgs) -> Result<LearnerConfig> {
    // The error names the file (and the line, for TOML errors).
    let mut cfg = LearnerConfig::load(&args.config)?;
    if let Some(addr) = args.listen {
        cfg.listen = addr.to_string();
    }
    if let Some(addr) = &args.prometheus {
        cfg.metrics.prometheus = addr.clone();
    }
    if let Some(dir) = &args.run_dir {
        cfg.run_dir = Some(dir.clone());
    }
    cfg.validate()
        .context("the config with command-line overrides")?;
    Ok(cfg)
}

/// Runs the command.
pub fn run(args: LearnerArgs) -> Result<ExitCode> {
    let cfg = resolve(&args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("corvid-learner-io")
        .build()
        .context("starting the async runtime")?;
    let run_dir = cfg.run_dir();
    let resume = args.resume
        || (args.resume_if_any
            && learner::has_checkpoint(&cfg)
                .with_context(|| format!("--resume-if-any: reading {}", run_dir.display()))?);
    if args.resume_if_any {
        eprintln!(
            "--resume-if-any: {} in {}",
            if resume {
                "resuming from the newest checkpoint"
            } else {
                "no checkpoint, starting a new run"
            },
            run_dir.display()
        );
    }
    let summary = runtime
        .block_on(learner::run(
            cfg,
            LearnerOptions { resume },
            learner::shutdown_signal(),
        ))
        .with_context(|| format!("learner run in {}", run_dir.display()))?;
    eprintln!(
        "learner stopped ({}): {} RL updates, policy version {}{}",
        summary.stopped_by,
        summary.rl_step,
        summary.policy_version,
        summary
            .checkpoint
            .map(|p| format!(", last checkpoint {}", p.display()))
            .unwrap_or_default()
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: LearnerArgs,
    }

    #[test]
    fn flags_override_the_config() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.toml");
        std::fs::write(&path, "run_name = \"t\"\nlisten = \"127.0.0.1:1\"\n").unwrap();
        let cli = Cli::parse_from([
            "x",
            "--config",
            path.to_str().unwrap(),
            "--listen",
            "127.0.0.1:7777",
            "--run-dir",
            "/tmp/somewhere",
            "--prometheus",
            "127.0.0.1:9999",
            "--resume",
        ]);
        assert!(cli.args.resume);
        let cfg = resolve(&cli.args).unwrap();
        assert_eq!(cfg.listen, "127.0.0.1:7777");
        assert_eq!(cfg.run_dir(), PathBuf::from("/tmp/somewhere"));
        assert_eq!(cfg.metrics.prometheus, "127.0.0.1:9999");
        assert_eq!(cfg.run_name, "t");
        // A Prometheus address that is no address is refused by the config's own check.
        let mut cli = Cli::parse_from(["x", "--config", path.to_str().unwrap()]);
        cli.args.prometheus = Some("nowhere".into());
        let e = format!("{:#}", resolve(&cli.args).unwrap_err());
        assert!(e.contains("prometheus"), "{e}");
        let bad = Cli::try_parse_from(["x", "--config", "c", "--listen", "nowhere"]);
        assert!(bad.is_err());
    }
}
