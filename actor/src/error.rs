//! The actor's error type.

use std::io::ErrorKind;
use std::path::Path;

use corvid_model::ModelError;

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
    /// The token file cannot be read, or holds no token that can be sent (see
    /// [`crate::read_token_file`]). Displays as `token file PATH: what is wrong`.
    #[error("{}", token_file_message(path, error))]
    TokenFile {
        /// The file.
        path: std::path::PathBuf,
        /// The OS error, or `InvalidData` for unusable contents.
        error: std::io::Error,
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

/// `token file PATH: what is wrong[; what to do]`.
pub fn token_file_message(path: &Path, error: &std::io::Error) -> String {
    let what = format!("token file {}: {error}", path.display());
    let hint = match error.kind() {
        ErrorKind::NotFound => {
            "`corvid learner` writes the run's token to <run folder>/token (or its `token_file`) \
             when it starts: give the actor that file or a copy of it"
        }
        ErrorKind::PermissionDenied => {
            "this user may not read it; check its owner and mode (the learner creates it 0600)"
        }
        ErrorKind::IsADirectory => "give the file that holds the token, not a folder",
        _ => return what,
    };
    format!("{what}; {hint}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read_token_file;

    /// The error `read_token_file` gives for `path`, with `path` written as `PATH`.
    fn token_error(path: &Path) -> String {
        let e = read_token_file(path).unwrap_err();
        assert!(matches!(e, ActorError::TokenFile { .. }), "{e:?}");
        let text = e.to_string();
        let shown = path.display().to_string();
        assert_eq!(text.matches(&shown).count(), 1, "the path once: {text}");
        text.replace(&shown, "PATH")
    }

    #[test]
    fn a_bad_token_file_is_named_once_with_what_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, bytes: &[u8]| {
            let p = dir.path().join(name);
            std::fs::write(&p, bytes).unwrap();
            p
        };
        assert_eq!(
            read_token_file(&file("good", b"  s3cret \r\nrest\n")).unwrap(),
            "s3cret"
        );

        let e = token_error(&dir.path().join("missing"));
        assert!(
            e.starts_with("token file PATH: ")
                && e.contains("os error 2")
                && e.ends_with(
                    "; `corvid learner` writes the run's token to <run folder>/token (or its \
                     `token_file`) when it starts: give the actor that file or a copy of it"
                ),
            "{e}"
        );
        let e = token_error(dir.path());
        assert!(
            e.starts_with("token file PATH: ")
                && e.ends_with("; give the file that holds the token, not a folder"),
            "{e}"
        );
        let e = token_error(&file("empty", b""));
        assert_eq!(
            e,
            "token file PATH: the first line holds no token (the file is empty)"
        );
        let e = token_error(&file("bad", b"s3c\x01ret\n"));
        assert!(
            e.starts_with(
                "token file PATH: byte 0x01 at offset 3 (line 1, column 4) is not visible ASCII"
            ),
            "{e}"
        );
    }

    #[test]
    fn token_file_messages_name_the_path_once_and_hint_by_kind() {
        let p = Path::new("/srv/run/token");
        let io = |kind: ErrorKind, msg: &str| std::io::Error::new(kind, msg.to_string());
        assert_eq!(
            token_file_message(p, &io(ErrorKind::PermissionDenied, "Permission denied")),
            "token file /srv/run/token: Permission denied; this user may not read it; check its \
             owner and mode (the learner creates it 0600)"
        );
        assert_eq!(
            token_file_message(p, &io(ErrorKind::Other, "Input/output error")),
            "token file /srv/run/token: Input/output error"
        );
        assert_eq!(
            token_file_message(p, &io(ErrorKind::InvalidData, "bad")),
            "token file /srv/run/token: bad"
        );
    }
}
