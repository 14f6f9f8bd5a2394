//! `corvid`: the command line that wires Corvid's crates together.
//!
//! Each subcommand lives in `src/cmd/<name>.rs` with its own `Args` and `run`;
//! benchmarks live in `src/bench/`. `main` only parses, sets up logging and maps
//! errors to exit codes:
//!
//! | code | meaning |
//! |---|---|
//! | 0 | success |
//! | 1 | the command failed (the message says what and where) |
//! | 2 | bad usage (clap) or a command not available in this build |

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod cmd;
mod report;

/// Corvid: agentic-RL post-training for Mixture-of-Experts tool-using policies.
#[derive(Parser, Debug)]
#[command(name = "corvid", version, about, long_about = None)]
#[command(after_help = "Examples:
  corvid run --config configs/demo.toml          train an agent end to end on this machine
  corvid replay list --store runs/demo/store     list stored trajectories
  corvid report --run-dir runs/demo              rewrite a run's report from its folder
  corvid bench ingest --tokens 1000000 --json    measure trajectory ingest

Logging: set RUST_LOG (e.g. RUST_LOG=corvid=debug).")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Train end to end: a learner and K actor processes, SFT then RL, evaluation and a report.
    Run(cmd::run::RunArgs),
    /// Serve tasks and weights to actors, ingest trajectories and train.
    Learner(cmd::learner::LearnerArgs),
    /// Roll out episodes against sandboxed tools and stream them to a learner.
    Actor(cmd::actor::ActorArgs),
    /// Evaluate a checkpoint on held-out tasks.
    Eval(cmd::eval::EvalArgs),
    /// List, show and export stored trajectories.
    Replay(cmd::replay::ReplayArgs),
    /// Rewrite a run's report (report.json, charts, report.html) from its folder.
    Report(cmd::report::ReportArgs),
    /// List, show, sample and validate task families and task packs.
    Tasks(cmd::tasks::TasksArgs),
    /// Run tools in the sandbox exactly as the policy would.
    Sandbox(cmd::sandbox::SandboxArgs),
    /// Inspect, run and export models: presets, model TOMLs and Hugging Face folders.
    Model(cmd::model::ModelArgs),
    /// Benchmarks; each prints one JSON object with --json.
    Bench(bench::BenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(
        cli.command,
        Command::Model(_)
            | Command::Tasks(_)
            | Command::Replay(_)
            | Command::Report(_)
            | Command::Sandbox(_)
    ) {
        quiet_on_closed_stdout();
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colours only on a terminal: logs redirected to files stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let result = match cli.command {
        Command::Run(a) => cmd::run::run(a),
        Command::Learner(a) => cmd::learner::run(a),
        Command::Actor(a) => cmd::actor::run(a),
        Command::Eval(a) => cmd::eval::run(a),
        Command::Replay(a) => cmd::replay::run(a),
        Command::Report(a) => cmd::report::run(a),
        Command::Tasks(a) => cmd::tasks::run(a),
        Command::Sandbox(a) => cmd::sandbox::run(a),
        Command::Model(a) => cmd::model::run(a),
        Command::Bench(a) => bench::run(a),
    };
    match result {
        Ok(code) => code,
        // Output piped into `head` and closed early is not an error (as ripgrep does).
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {}", error_text(&err));
            ExitCode::FAILURE
        }
    }
}

/// Lets a closed stdout end the process quietly, as it ends `cat` or `grep`
/// (`corvid tasks show … | head`): `println!` panics on a write to a closed pipe while Rust
/// ignores SIGPIPE. Only for the commands that read files and print: commands that talk
/// gRPC or supervise child processes keep SIGPIPE ignored, so that a peer that went away
/// is an error they handle, not a signal that kills them (children inherit the setting).
fn quiet_on_closed_stdout() {
    #[cfg(unix)]
    // SAFETY: called once at start-up, before any other thread exists; it only resets one
    // signal's disposition to the default.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// `err` and its causes joined by `: ` (as `{err:#}`), leaving out a cause whose text the
/// message before it already ends with: many errors name their source in their own message
/// (`checkpoint x: No such file or directory`) and also chain it, which `{err:#}` repeats.
pub(crate) fn error_text(err: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if out.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// Whether `err` comes from writing to a closed pipe (`corvid replay list | head`).
pub(crate) fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;
    use clap::CommandFactory;

    #[test]
    fn an_error_names_each_cause_once() {
        let os = || std::io::Error::from(std::io::ErrorKind::NotFound);
        // The model error names its OS error and also chains it as its source.
        let dir = std::path::Path::new("/nonexistent/ckpt");
        let err = corvid_model::checkpoint::load_config(dir)
            .context("reading checkpoint /nonexistent/ckpt")
            .expect_err("no such checkpoint");
        let text = error_text(&err);
        assert!(
            text.starts_with(
                "reading checkpoint /nonexistent/ckpt: /nonexistent/ckpt/config.json: "
            ),
            "{text}"
        );
        assert_eq!(text.matches("os error").count(), 1, "{text}");
        // A cause the message does not name is still shown.
        let err = anyhow::Error::new(os()).context("reading runs/x/config.json");
        assert_eq!(
            error_text(&err),
            format!("reading runs/x/config.json: {}", os())
        );
    }

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_subcommand_has_help_with_an_example() {
        let cli = Cli::command();
        for name in [
            "run", "learner", "actor", "eval", "replay", "report", "tasks", "sandbox", "bench",
        ] {
            let sub = cli
                .find_subcommand(name)
                .unwrap_or_else(|| panic!("missing subcommand {name}"));
            assert!(sub.get_about().is_some(), "{name} has no help text");
            let after = sub
                .get_after_help()
                .map(|s| s.to_string())
                .unwrap_or_default();
            assert!(
                after.contains("corvid "),
                "{name} has no example in after_help"
            );
        }
    }
}
