//! The Corvid actor: batched rollouts on the latent cache, sandboxed tool steps, trajectory
//! streaming and weight sync.
//!
//! # The reusable API: run a batch of task instances with given weights
//!
//! [`run_episodes`] (or [`RolloutEngine`] for streaming output) runs task instances to
//! completion with a policy and sampling parameters — greedy when the temperature is 0 —
//! and returns the finished trajectories (header, steps, footer), exactly as an actor
//! would submit them. `corvid eval` and the end-to-end run use it.
//!
//! ```no_run
//! use std::sync::Arc;
//! use corvid_actor::{run_episodes, EngineConfig, EpisodeSpec, LoadedPolicy};
//! use corvid_model::ModelConfig;
//! use corvid_proto::SamplingParams;
//! use corvid_tasks::TaskEnv;
//!
//! let env = TaskEnv::new(corvid_sandbox::Sandbox::builder().search_tool(true).build()?);
//! let mut policy = LoadedPolicy::random(&ModelConfig::tiny(), tch::Device::Cpu)?;
//! let task = Arc::new(corvid_tasks::builtin_family("hops")?.instance(1, 7)?);
//! let greedy = SamplingParams { temperature: 0.0, top_p: 1.0, max_new_tokens: 128, seed: 0 };
//! let specs = (0..4)
//!     .map(|i| EpisodeSpec::new(format!("eval-{i}"), task.clone(), greedy))
//!     .collect();
//! let (trajectories, stats) = run_episodes(&mut policy, &env, specs, EngineConfig::default(), None)?;
//! assert_eq!(trajectories.len(), 4);
//! println!("{} tokens generated", stats.generated_tokens);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! - [`EpisodeSpec`]: one episode (trajectory id, task instance, group, turn limit, context
//!   budget, sampling with its seed).
//! - [`LoadedPolicy`]: a model, its weights and their version ([`LoadedPolicy::random`],
//!   [`LoadedPolicy::from_bytes`], [`LoadedPolicy::load`]).
//! - [`RolloutEngine`]: the batched engine; [`EngineHandle`] feeds it episodes and new
//!   weights from other threads; a [`TrajectorySink`] receives each trajectory as it grows
//!   ([`CollectSink`] keeps them whole). [`RolloutStats`] counts tokens, forwards and tool
//!   time.
//! - [`TokenChooser`]: how each token is picked — [`NucleusSampler`] (temperature, top-p,
//!   the episode's seed) or [`ScriptedTokens`] (forced tokens, log-probs still from the
//!   model).
//!
//! # The actor process
//!
//! [`run_actor`] is `corvid actor`: register, keep N episodes running, sync weights between
//! turns, stream every trajectory while it grows (journaled on disk, resent from the start on
//! a broken stream, spooled while the learner is away), and shut down without losing an
//! episode. See [`runner`] for the moving parts.
//!
//! # Modules
//!
//! [`episode`] (per-episode state machine) → [`rollout`] (batched engine) with
//! [`sampler`] and the sandbox workers; [`journal`] (on-disk parts) → [`submit`]
//! (streaming, resends, drain) and [`spool`]; [`client`] (the learner link and weight
//! fetch); [`tasks`] (task references to instances); [`runner`] ties them together.
#![deny(missing_docs)]

pub mod client;
pub mod episode;
pub mod error;
pub mod journal;
pub mod policy;
pub mod rollout;
pub mod runner;
pub mod sampler;
pub mod spool;
pub mod submit;
pub mod tasks;
mod tools;

pub use client::{Backoff, LearnerLink, Registration};
pub use episode::{tokens_per_step, EpisodeSpec, STEP_TOKEN_BYTES};
pub use error::ActorError;
pub use policy::{LoadedPolicy, PolicyUpdate};
pub use rollout::{
    run_episodes, run_episodes_into, CollectSink, EngineConfig, EngineHandle, RolloutEngine,
    RolloutStats, TrajectorySink,
};
pub use runner::{read_token_file, run_actor, ActorConfig, ActorReport};
pub use sampler::{Choice, ChoiceContext, NucleusSampler, ScriptedTokens, TokenChooser};
pub use spool::Spool;
pub use submit::{PartEvent, SubmitConfig, Submitted};
