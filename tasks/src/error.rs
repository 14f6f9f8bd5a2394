//! The one error type of `corvid-tasks`.

use thiserror::Error;

use crate::pack::PackDiagnostic;

/// Why a task, checker, pack or curriculum operation failed.
#[derive(Debug, Error)]
pub enum TasksError {
    /// No family or pack has this name.
    #[error("unknown task family `{name}`; known: {known}")]
    UnknownFamily {
        /// The requested name.
        name: String,
        /// Comma-separated known names.
        known: String,
    },
    /// The level is not one the family defines.
    #[error("family `{family}` has levels 1..={max}, not {level}")]
    LevelOutOfRange {
        /// Family name.
        family: String,
        /// The requested level.
        level: u32,
        /// The highest level.
        max: u32,
    },
    /// A configuration value is outside its allowed range.
    #[error("{field} = {value} is not allowed: {expected}")]
    InvalidConfig {
        /// Dotted field name, e.g. `curriculum.promote_threshold`.
        field: String,
        /// The offending value.
        value: String,
        /// What to write instead.
        expected: String,
    },
    /// A checker's regular expression does not compile.
    #[error("checker regex `{pattern}` does not compile: {message}")]
    InvalidRegex {
        /// The pattern.
        pattern: String,
        /// The regex crate's message.
        message: String,
    },
    /// A task pack has errors; each names its file and line.
    #[error("{} error(s) in task pack:\n{}", .0.len(), .0.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("\n"))]
    Pack(Vec<PackDiagnostic>),
    /// A valid task pack cannot build one instance with the values it drew (for example two
    /// `[files]` keys rendered to one path, or one to a folder of the other's path);
    /// validation reports what it finds beforehand, but past its rendering cap it does not
    /// try every combination of values.
    #[error("task pack {file}: instance {instance} ({vars}): {message}")]
    PackInstance {
        /// The pack file.
        file: String,
        /// The instance id, `pack/L<level>/s<seed>`.
        instance: String,
        /// The values drawn, `a = "x", b = "y"`.
        vars: String,
        /// What is wrong, naming the templates involved and what they rendered to.
        message: String,
    },
    /// Saved curriculum state could not be read back.
    #[error("curriculum state is not valid JSON of the expected shape: {0}")]
    State(String),
    /// The sandbox could not set up or read an episode's workspace (an infrastructure
    /// failure, never the policy's).
    #[error("task {task}: sandbox: {message}")]
    Sandbox {
        /// The task instance id.
        task: String,
        /// What failed.
        message: String,
    },
    /// Reading a file failed.
    #[error("cannot read {path}: {message}")]
    Io {
        /// The path.
        path: String,
        /// The OS message.
        message: String,
    },
}
