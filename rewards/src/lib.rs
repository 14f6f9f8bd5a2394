//! Corvid process rewards, returns, advantage estimators and evaluator metrics: pure
//! functions on plain slices.
//!
//! # Brief overview
//!
//! - [`ProcessRewardAggregation`] turns each turn's rule components into one process reward
//!   `p_t`; [`returns_to_go`] and [`discounted_returns`] turn rewards into returns.
//! - [`trajectory_advantages`] (GRPO, Dr.GRPO, RLOO via [`TrajectoryEstimator`]) and
//!   [`step_advantages`] (critic-free, baselined by turn index or state key via
//!   [`StepBaseline`]) give the learner its advantages. Episodes that ended in
//!   `infra_error` or `abandoned` are excluded from baselines and get `None`, never 0.
//! - [`EvalMetrics`], [`pass_at_k`] and [`pass_hat_k`] are the evaluator's numbers.
//!
//! Every function states its formula in its doc comment; `docs/tasks.md` collects them
//! in one table.
//!
//! ```
//! use corvid_proto::Termination;
//! use corvid_rewards::{trajectory_advantages, TrajectoryEstimator, RewardsError};
//! let r = [1.0, 0.0, 0.0, f64::NAN];
//! let t = [Termination::Answered, Termination::MaxTurns, Termination::Answered, Termination::InfraError];
//! let a = trajectory_advantages(&r, &t, TrajectoryEstimator::DrGrpo)?;
//! // mean over the three scored episodes is 1/3; the crashed one is left out.
//! assert!((a[0].unwrap() - 2.0 / 3.0).abs() < 1e-12);
//! assert_eq!(a[3], None);
//! # Ok::<(), RewardsError>(())
//! ```
#![deny(missing_docs)]

mod advantages;
mod error;
mod metrics;
mod returns;

pub use advantages::{
    broadcast_to_tokens, step_advantages, trajectory_advantages, StepBaseline, StepEpisode,
    TrajectoryEstimator,
};
pub use error::RewardsError;
pub use metrics::{
    mean_pass_at_k, mean_pass_hat_k, pass_at_k, pass_hat_k, EpisodeEval, EvalMetrics,
};
pub use returns::{discounted_returns, episode_reward, returns_to_go, ProcessRewardAggregation};
