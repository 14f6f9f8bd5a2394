//! The actor's error type.

use corvid_learner::model::ModelError;

/// Everything that can stop the rollout engine or the actor.
///
/// Per-episode problems (a tool that fails, a malformed call, a sandbox that crashes) are
/// not errors: they end up in the trajectory (a tool message, or an `infra_error`
/// termination). These are the failures of the machinery itself.
#[derive(Debug, thiserror::Error)]
pub enum ActorError {
    /// The model failed (bad shapes, libtorch).
    #[error("model: {0}")]
    Model(#[from] ModelError),
    /// libtorch failed outside a model call (tensor conversion).
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
    /// A setting or an input is out of range.
    #[error("invalid {what}: {why}")]
    Invalid {
        /// The setting or input.
        what: String,
        /// What is wrong with it.
        why: String,
    },
    /// A task reference cannot be turned into a task instance.
    #[error("task {task}: {why}")]
    Task {
        /// The task reference (`family/level/seed`).
        task: String,
        /// Why.
        why: String,
    },
    /// A journal or spool file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file or folder.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A journal file is damaged beyond its torn tail.
    #[error("journal {path}: {why}")]
    Journal {
        /// The file.
        path: String,
        /// What is wrong.
        why: String,
    },
    /// The learner refused or failed a call in a way retrying does not fix.
    #[error("learner: {0}")]
    Learner(String),
    /// Policy weights that do not match their announced checksum or size.
    #[error("policy v{version}: {why}")]
    Weights {
        /// The version fetched.
        version: u64,
        /// What is wrong.
        why: String,
    },
    /// The engine thread is gone (it panicked or was shut down).
    #[error("the rollout engine stopped: {0}")]
    EngineGone(String),
}

impl ActorError {
    /// An [`ActorError::Invalid`].
    pub fn invalid(what: impl Into<String>, why: impl Into<String>) -> Self {
        ActorError::Invalid {
            what: what.into(),
            why: why.into(),
        }
    }

    /// An [`ActorError::Io`] for `path`.
    pub fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> ActorError + '_ {
        move |source| ActorError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}
