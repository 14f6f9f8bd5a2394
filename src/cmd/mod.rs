//! One module per subcommand: its `Args` and its `run`.

pub mod actor;
pub mod eval;
pub mod learner;
pub mod model;
pub mod replay;
pub mod report;
pub mod run;
pub mod sandbox;
pub mod tasks;

/// The answer of a subcommand whose issue has not landed in this build.
///
/// Exit code 2 and a message that names what is missing, instead of a silent no-op.
pub fn not_yet(command: &str, lands_with: &str) -> anyhow::Result<std::process::ExitCode> {
    eprintln!(
        "error: `corvid {command}` is not available in this build yet; it lands with {lands_with}."
    );
    Ok(std::process::ExitCode::from(2))
}
