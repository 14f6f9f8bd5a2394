//! The Corvid actor (placeholder doc; completed below).
#![deny(missing_docs)]

pub mod episode;
pub mod error;
pub mod policy;
pub mod rollout;
pub mod sampler;
mod tools;

pub use episode::EpisodeSpec;
pub use error::ActorError;
pub use policy::{LoadedPolicy, PolicyUpdate};
pub use rollout::{
    run_episodes, CollectSink, EngineConfig, EngineHandle, RolloutEngine, RolloutStats, Trajectory,
    TrajectorySink,
};
pub use sampler::{Choice, ChoiceContext, NucleusSampler, ScriptedTokens, TokenChooser};
