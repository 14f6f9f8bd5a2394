//! corvid-eval: run a policy on held-out task instances and report, per level, the success
//! rate, tool-call parse and success rates, multi-step completion, failure recovery, pass@k
//! and pass^k, mean turns and tokens. Every evaluation episode is stored, so `corvid replay`
//! can show, export and re-score it.
//!
//! `corvid eval` is the command; `corvid run` evaluates each stage's policy with it.
//!
//! # Use
//!
//! ```no_run
//! use corvid_eval::{open_store, EvalOptions, Plan, PolicySource};
//!
//! let opts = EvalOptions {
//!     policy: PolicySource::RandomInit { preset: "tiny".into(), config: None },
//!     family: "hops".into(),
//!     pack: None,
//!     levels: (1, 2),
//!     episodes: 50,
//!     k: 1,
//!     temperature: 0.0,
//!     top_p: 1.0,
//!     max_new_tokens: 256,
//!     seed: 1 << 62,
//!     concurrency: 32,
//!     threads: 1,
//!     label: Some("random".into()),
//!     stage: "random".into(),
//!     progress: true,
//!     context: None,
//!     tool_call_format: None,
//! };
//! // Every option, the family and the policy are checked before a store exists.
//! let plan = Plan::new(opts)?;
//! let env = corvid_tasks::TaskEnv::new(corvid_sandbox::Sandbox::builder().search_tool(true).build()?);
//! let store = open_store("runs/eval/store".as_ref())?;
//! let result = plan.run(&env, &store)?;
//! println!("{}", serde_json::to_string_pretty(&result)?);
//! # Ok::<(), anyhow::Error>(())
//! ```
//!
//! # Modules
//!
//! - `plan`: [`EvalOptions`] and the checked [`Plan`] (options, family, policy).
//! - `policy`: [`PolicySource`] and the loaded policy with its weights fingerprint, recorded
//!   as `actor_id = eval@<fingerprint>` in every stored episode.
//! - `run`: [`Plan::run`], level by level.
//! - `reuse`: [`open_store`], and which stored episodes a level reuses or refuses.
//! - `sink`: the trajectory sink that stores episodes and keeps them for the figures.
//! - `metrics`: [`episode_eval`], [`level_result`] and the serialised [`EvalResult`].
//!
//! # Stored episodes
//!
//! Ids are `<label>.<family>.L<level>.s<seed>.k<i>`. A label whose episodes the store
//! already holds at a level is reused when those episodes are exactly this evaluation's (same
//! weights, policy version, sampling, instances: a re-run, or the rest of an interrupted one)
//! and refused otherwise.

mod metrics;
mod plan;
mod policy;
mod reuse;
mod run;
mod sink;
#[cfg(test)]
mod testing;

pub use metrics::{
    episode_eval, first_fact_read, level_result, DensityBucket, EvalResult, FamilyResult,
    InstanceFacts, LevelResult, Position, Tally, TokenBucket, FIRST_BUCKET, MIN_BUCKET_EPISODES,
};
pub use plan::{EvalOptions, Plan};
pub use policy::PolicySource;
pub use reuse::open_store;
