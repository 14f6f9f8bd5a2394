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

/// The sandbox the CLI runs tasks in (the search tool on, as actors have it), wrapped for
/// episodes of any task.
pub(crate) fn task_env() -> anyhow::Result<corvid_tasks::TaskEnv> {
    use anyhow::Context;
    let sandbox = corvid_sandbox::Sandbox::builder()
        .search_tool(true)
        .build()
        .context("starting the sandbox")?;
    Ok(corvid_tasks::TaskEnv::new(sandbox))
}
