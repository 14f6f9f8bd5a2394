//! Checkers: decide whether an episode solved its task.
//!
//! [`Checker::Exact`], [`Checker::Regex`], [`Checker::Numeric`] and [`Checker::FileState`]
//! need no sandbox: they read the final answer and a map `path → bytes` of the final
//! workspace, and are evaluated here by [`Checker::check`].
//! [`Checker::CommandExit`], [`Checker::Wasi`] and [`Checker::Python`] must run code in
//! the sandbox; they are
//! declared here with their data and evaluated by the sandbox integration (the actor),
//! so [`Checker::check`] answers [`Verdict::NeedsSandbox`] for them.

use std::collections::BTreeMap;

use crate::error::TasksError;

/// What a file must look like at the end for [`Checker::FileState`].
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum FileExpectation {
    /// The file's text, with surrounding whitespace trimmed, equals `text` trimmed.
    Equals {
        /// Expected content.
        text: String,
    },
    /// The file contains `text`.
    Contains {
        /// Expected substring.
        text: String,
    },
    /// The file does not exist.
    Absent,
}

/// How an episode is judged.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Checker {
    /// The answer equals `expected` after trimming (and lower-casing both if
    /// `case_insensitive`).
    Exact {
        /// The expected answer.
        expected: String,
        /// Compare case-insensitively.
        #[serde(default)]
        case_insensitive: bool,
    },
    /// The whole trimmed answer matches `pattern` (anchored: `^(?:pattern)$`).
    Regex {
        /// A `regex` crate pattern.
        pattern: String,
    },
    /// The answer parses as a number within `tolerance` of `expected`:
    /// `|answer − expected| <= tolerance`.
    Numeric {
        /// Expected value.
        expected: f64,
        /// Absolute tolerance, `>= 0`.
        tolerance: f64,
    },
    /// Every listed file of the final workspace meets its expectation.
    FileState {
        /// Path (relative to the workspace) → expectation. In a task pack both the paths
        /// and the texts are templates, rendered with the instance's variables (the paths
        /// under the rules of `[files]` paths).
        files: BTreeMap<String, FileExpectation>,
    },
    /// Sandbox only: `command` run in the final workspace exits with `exit_code`.
    CommandExit {
        /// A toolbox command line.
        command: String,
        /// The exit status that means success.
        exit_code: i32,
    },
    /// Sandbox only: a custom WASI module reads the final workspace read-only and exits 0
    /// to accept.
    Wasi {
        /// Path of the `.wasm` module, relative to the pack file.
        module: String,
        /// Arguments passed to it.
        #[serde(default)]
        args: Vec<String>,
    },
    /// Sandbox only: a Python program run with the `python` tool over the final workspace
    /// (read-only, its working directory) exits 0 to accept. `sys.argv[1]` is the answer
    /// (empty when none was given), then `args`.
    Python {
        /// The program. In a pack it is templated: `{name}` is a variable, `{{` and `}}`
        /// are Python's braces.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code: Option<String>,
        /// Or a file holding it (a pack writes it relative to the pack file; the instance
        /// holds it resolved). It is read when an episode is checked, and not templated.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        script: Option<String>,
        /// Arguments after the answer.
        #[serde(default)]
        args: Vec<String>,
    },
}

/// A checker's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Solved.
    Pass,
    /// Not solved, and why (shown in `corvid tasks show --oracle` and evaluation reports).
    Fail(String),
    /// The checker must run in the sandbox; see the module doc.
    NeedsSandbox,
}

impl Verdict {
    /// Whether the verdict is [`Verdict::Pass`].
    pub fn passed(&self) -> bool {
        matches!(self, Verdict::Pass)
    }
}

/// Why the `shell` tool cannot run a [`Checker::CommandExit`] command line as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ShellLineProblem {
    /// A command the toolbox shell does not have: it exits 127, "command not found".
    UnknownCommand(String),
    /// The shell does not parse the line (it exits 2 without running anything).
    Syntax(String),
    /// The `shell` tool refuses the call (`invalid_call`): too long, or a NUL byte.
    Refused(String),
}

impl std::fmt::Display for ShellLineProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::UnknownCommand(name) => write!(
                f,
                "the toolbox shell has no command {name:?} (it would exit 127, command not found)"
            ),
            Self::Syntax(why) => write!(
                f,
                "the toolbox shell cannot parse it: {why} (it would exit 2 without running it)"
            ),
            Self::Refused(why) => write!(f, "the shell tool refuses it ({why})"),
        }
    }
}

/// The command name of each simple command of a toolbox shell command line, in order
/// (`None` for a name known only at run time), or why the shell does not parse it. The
/// grammar is the toolbox's own (`corvid-shell-syntax`), so the errors are the shell's.
fn shell_command_names(line: &str) -> Result<Vec<Option<String>>, String> {
    let script = corvid_shell_syntax::parse_line(line)?;
    Ok(script
        .iter()
        .flat_map(|(_, pipeline)| pipeline)
        .filter_map(|command| command.words.first())
        .map(corvid_shell_syntax::static_text)
        .collect())
}

/// Whether `line` runs `python` or `python3`, which the toolbox shell has only in a task that
/// allows the `python` tool (its episodes run in the sandbox with the interpreter).
pub(crate) fn shell_line_runs_python(line: &str) -> bool {
    shell_command_names(line).is_ok_and(|names| {
        names
            .iter()
            .flatten()
            .any(|n| n == "python" || n == "python3")
    })
}

/// Whether the `shell` tool can run `line` as written: the tool accepts it, the toolbox
/// shell parses it and has every command it names (a name known only at run time, from a
/// variable or a glob, is not checked).
pub(crate) fn check_shell_line(line: &str) -> Result<(), ShellLineProblem> {
    let max = corvid_sandbox::limits::MAX_COMMAND_BYTES;
    if line.len() > max {
        return Err(ShellLineProblem::Refused(format!(
            "it is {} bytes; the limit is {max}",
            line.len()
        )));
    }
    if line.contains('\0') {
        return Err(ShellLineProblem::Refused("it contains a NUL byte".into()));
    }
    let names = shell_command_names(line).map_err(ShellLineProblem::Syntax)?;
    match names
        .into_iter()
        .flatten()
        .find(|n| !Checker::SHELL_COMMANDS.contains(&n.as_str()))
    {
        Some(unknown) => Err(ShellLineProblem::UnknownCommand(unknown)),
        None => Ok(()),
    }
}

impl Checker {
    /// The commands of the toolbox shell that runs a [`Checker::CommandExit`] command (the
    /// `shell` tool): the list its `help` prints (`sandbox/toolbox/src/cmds.rs`
    /// `COMMANDS`). Any other command name exits 127, "command not found".
    pub const SHELL_COMMANDS: &'static [&'static str] = &[
        "basename", "calc", "cat", "cd", "cp", "cut", "diff", "dirname", "echo", "expr", "false",
        "find", "grep", "head", "help", "ls", "mkdir", "mv", "printf", "pwd", "python", "python3",
        "rm", "sed", "seq", "sort", "tail", "touch", "tr", "true", "uniq", "wc",
    ];

    /// Checks the checker's own data: a regex compiles; a tolerance is `>= 0`; a
    /// `command_exit` command is one the `shell` tool runs (it parses, and names only
    /// commands the toolbox shell has).
    pub fn validate(&self) -> Result<(), TasksError> {
        match self {
            Checker::CommandExit { command, .. } => {
                check_shell_line(command).map_err(|e| TasksError::InvalidConfig {
                    field: "checker.command".into(),
                    value: format!("{command:?}"),
                    expected: format!(
                        "a command line the toolbox shell runs: {e}; its commands are {}",
                        Checker::SHELL_COMMANDS.join(" ")
                    ),
                })
            }
            Checker::Regex { pattern } => regex::Regex::new(&format!("^(?:{pattern})$"))
                .map(|_| ())
                .map_err(|e| TasksError::InvalidRegex {
                    pattern: pattern.clone(),
                    message: e.to_string(),
                }),
            Checker::Python { code, script, .. } if code.is_some() == script.is_some() => {
                Err(TasksError::InvalidConfig {
                    field: "checker".into(),
                    value: "kind = \"python\"".into(),
                    expected: "exactly one of `code` (the program) or `script` (a file holding it)"
                        .into(),
                })
            }
            Checker::Numeric {
                expected,
                tolerance,
            } if !(tolerance.is_finite() && *tolerance >= 0.0 && expected.is_finite()) => {
                Err(TasksError::InvalidConfig {
                    field: "checker.tolerance".into(),
                    value: tolerance.to_string(),
                    expected: "a finite tolerance >= 0 and a finite expected value".into(),
                })
            }
            _ => Ok(()),
        }
    }

    /// Judges `answer` (the argument of the final `answer` call, if any) and the final
    /// `workspace`. Sandbox-only variants answer [`Verdict::NeedsSandbox`].
    pub fn check(&self, answer: Option<&str>, workspace: &BTreeMap<String, Vec<u8>>) -> Verdict {
        let need_answer = || {
            answer
                .map(str::trim)
                .ok_or("no answer was given".to_string())
        };
        match self {
            Checker::Exact {
                expected,
                case_insensitive,
            } => match need_answer() {
                Err(e) => Verdict::Fail(e),
                Ok(a) => {
                    let ok = if *case_insensitive {
                        a.to_lowercase() == expected.trim().to_lowercase()
                    } else {
                        a == expected.trim()
                    };
                    if ok {
                        Verdict::Pass
                    } else {
                        Verdict::Fail(format!("answer {a:?} is not {:?}", expected.trim()))
                    }
                }
            },
            Checker::Regex { pattern } => match need_answer() {
                Err(e) => Verdict::Fail(e),
                Ok(a) => match regex::Regex::new(&format!("^(?:{pattern})$")) {
                    Err(e) => Verdict::Fail(format!("checker regex does not compile: {e}")),
                    Ok(re) if re.is_match(a) => Verdict::Pass,
                    Ok(_) => Verdict::Fail(format!("answer {a:?} does not match /{pattern}/")),
                },
            },
            Checker::Numeric {
                expected,
                tolerance,
            } => match need_answer() {
                Err(e) => Verdict::Fail(e),
                Ok(a) => match a.parse::<f64>() {
                    Ok(x) if (x - expected).abs() <= *tolerance => Verdict::Pass,
                    Ok(x) => Verdict::Fail(format!("{x} is not within {tolerance} of {expected}")),
                    Err(_) => Verdict::Fail(format!("answer {a:?} is not a number")),
                },
            },
            Checker::FileState { files } => {
                for (path, want) in files {
                    let have = workspace.get(path).map(|b| String::from_utf8_lossy(b));
                    let fail = match (want, have) {
                        (FileExpectation::Absent, None) => None,
                        (FileExpectation::Absent, Some(_)) => {
                            Some(format!("{path} should not exist"))
                        }
                        (_, None) => Some(format!("{path} does not exist")),
                        (FileExpectation::Equals { text }, Some(h)) => (h.trim() != text.trim())
                            .then(|| {
                                format!("{path} holds {:?}, expected {:?}", h.trim(), text.trim())
                            }),
                        (FileExpectation::Contains { text }, Some(h)) => (!h
                            .contains(text.as_str()))
                        .then(|| format!("{path} does not contain {text:?}")),
                    };
                    if let Some(f) = fail {
                        return Verdict::Fail(f);
                    }
                }
                Verdict::Pass
            }
            Checker::CommandExit { .. } | Checker::Wasi { .. } | Checker::Python { .. } => {
                Verdict::NeedsSandbox
            }
        }
    }
}
