//! Checkers: decide whether an episode solved its task.
//!
//! [`Checker::Exact`], [`Checker::Regex`], [`Checker::Numeric`] and [`Checker::FileState`]
//! need no sandbox: they read the final answer and a map `path → bytes` of the final
//! workspace, and are evaluated here by [`Checker::check`].
//! [`Checker::CommandExit`] and [`Checker::Wasi`] must run code in the sandbox; they are
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

/// One token of a toolbox shell command line, as far as finding its command names needs.
enum ShellTok {
    /// A word: its text, and whether it is only known at run time (a variable, `$?`, or an
    /// unquoted glob character that may match files).
    Word(String, bool),
    Pipe,
    And,
    Or,
    Semi,
    /// `>`, `>>`, `<`, `2>`, `2>>`: the next token must be a word, the file name.
    Redirect,
    /// `2>&1`.
    ErrToOut,
}

/// Lexes `line` as the toolbox shell does (`sandbox/toolbox/src/shell.rs` `lex`: the same
/// operators, quotes, escapes, variables, comments and refusals).
fn shell_lex(line: &str) -> Result<Vec<ShellTok>, String> {
    // The characters a `$` at `i` consumes as a variable (`$?`, `${NAME}`, `$NAME`).
    fn var_len(chars: &[char], i: usize) -> Option<usize> {
        match chars.get(i + 1) {
            Some('?') => Some(2),
            Some('{') => chars[i + 2..]
                .iter()
                .position(|c| *c == '}')
                .map(|end| end + 3),
            Some(c) if c.is_ascii_alphabetic() || *c == '_' => {
                let mut j = i + 1;
                while j < chars.len() && (chars[j].is_ascii_alphanumeric() || chars[j] == '_') {
                    j += 1;
                }
                Some(j - i)
            }
            _ => None,
        }
    }
    // The `$` at `i`: a variable makes the word known only at run time, a lone `$` is
    // literal. Returns the index after it.
    fn dollar(chars: &[char], i: usize, word: &mut String, dynamic: &mut bool) -> usize {
        match var_len(chars, i) {
            Some(n) => {
                *dynamic = true;
                i + n
            }
            None => {
                word.push('$');
                i + 1
            }
        }
    }
    let chars: Vec<char> = line.chars().collect();
    let mut toks = Vec::new();
    let mut word = String::new();
    let mut dynamic = false;
    let mut in_word = false;
    let mut i = 0;
    macro_rules! end_word {
        () => {
            if in_word {
                toks.push(ShellTok::Word(std::mem::take(&mut word), dynamic));
                dynamic = false;
                in_word = false;
            }
        };
    }
    while i < chars.len() {
        let c = chars[i];
        match c {
            ' ' | '\t' | '\r' => {
                end_word!();
                i += 1;
            }
            '\n' | ';' => {
                end_word!();
                toks.push(ShellTok::Semi);
                i += 1;
            }
            '|' => {
                end_word!();
                if chars.get(i + 1) == Some(&'|') {
                    toks.push(ShellTok::Or);
                    i += 2;
                } else {
                    toks.push(ShellTok::Pipe);
                    i += 1;
                }
            }
            '&' => {
                end_word!();
                if chars.get(i + 1) != Some(&'&') {
                    return Err("background jobs (`&`) are not supported".into());
                }
                toks.push(ShellTok::And);
                i += 2;
            }
            '>' => {
                end_word!();
                toks.push(ShellTok::Redirect);
                i += if chars.get(i + 1) == Some(&'>') { 2 } else { 1 };
            }
            '<' => {
                end_word!();
                toks.push(ShellTok::Redirect);
                i += 1;
            }
            '2' if !in_word && chars.get(i + 1) == Some(&'>') => {
                if chars.get(i + 2) == Some(&'&') && chars.get(i + 3) == Some(&'1') {
                    toks.push(ShellTok::ErrToOut);
                    i += 4;
                } else {
                    toks.push(ShellTok::Redirect);
                    i += if chars.get(i + 2) == Some(&'>') { 3 } else { 2 };
                }
            }
            '#' if !in_word => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '\'' => {
                in_word = true;
                let end = chars[i + 1..]
                    .iter()
                    .position(|c| *c == '\'')
                    .ok_or("unterminated single quote")?;
                word.extend(&chars[i + 1..i + 1 + end]);
                i += end + 2;
            }
            '"' => {
                in_word = true;
                i += 1;
                loop {
                    let Some(&c) = chars.get(i) else {
                        return Err("unterminated double quote".into());
                    };
                    match c {
                        '"' => {
                            i += 1;
                            break;
                        }
                        '\\' if matches!(chars.get(i + 1), Some('"' | '\\' | '$' | '`')) => {
                            word.push(chars[i + 1]);
                            i += 2;
                        }
                        '$' => i = dollar(&chars, i, &mut word, &mut dynamic),
                        _ => {
                            word.push(c);
                            i += 1;
                        }
                    }
                }
            }
            '\\' => {
                in_word = true;
                if let Some(&n) = chars.get(i + 1) {
                    if n != '\n' {
                        word.push(n);
                    }
                    i += 2;
                } else {
                    i += 1;
                }
            }
            '$' => {
                in_word = true;
                i = dollar(&chars, i, &mut word, &mut dynamic);
            }
            '`' | '(' | ')' => {
                return Err(format!(
                    "`{c}` (subshells and command substitution) is not supported"
                ));
            }
            _ => {
                in_word = true;
                // An unquoted wildcard may expand to file names: `*`, `?`, or a `[…]` class
                // (a lone `[`, as in `[ -f x ]`, matches nothing and runs as itself).
                dynamic |= matches!(c, '*' | '?') || (c == ']' && word.contains('['));
                word.push(c);
                i += 1;
            }
        }
    }
    if in_word {
        toks.push(ShellTok::Word(word, dynamic));
    }
    Ok(toks)
}

/// The command name of each simple command of a toolbox shell command line, in order
/// (`None` for a name known only at run time), or why the shell does not parse it
/// (`sandbox/toolbox/src/shell.rs` `parse`, with the same syntax errors).
fn shell_command_names(line: &str) -> Result<Vec<Option<String>>, String> {
    let mut names = Vec::new();
    // The current command: whether it has a word or a redirect, and its first word.
    let mut empty = true;
    let mut first: Option<Option<String>> = None;
    // Commands of the current pipeline so far; whether the last list operator was `;`.
    let mut piped = 0;
    let mut seq = true;
    let mut toks = shell_lex(line)?.into_iter();
    while let Some(t) = toks.next() {
        match t {
            ShellTok::Word(text, dynamic) => {
                empty = false;
                first.get_or_insert((!dynamic).then_some(text));
            }
            ShellTok::Redirect => match toks.next() {
                Some(ShellTok::Word(..)) => empty = false,
                _ => return Err("syntax error: a redirect needs a file name".into()),
            },
            ShellTok::ErrToOut => empty = false,
            ShellTok::Pipe => {
                if empty {
                    return Err("syntax error near `|`".into());
                }
                names.extend(first.take());
                empty = true;
                piped += 1;
            }
            ShellTok::And | ShellTok::Or | ShellTok::Semi => {
                let is_semi = matches!(t, ShellTok::Semi);
                if empty {
                    if piped > 0 || !is_semi {
                        return Err("syntax error near an operator".into());
                    }
                } else {
                    names.extend(first.take());
                    empty = true;
                    piped = 0;
                }
                seq = is_semi;
            }
        }
    }
    if empty {
        if piped > 0 || !seq {
            return Err("syntax error: unexpected end of command".into());
        }
    } else {
        names.extend(first.take());
    }
    Ok(names)
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
        "find", "grep", "head", "help", "ls", "mkdir", "mv", "printf", "pwd", "rm", "sed", "seq",
        "sort", "tail", "touch", "tr", "true", "uniq", "wc",
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
            Checker::CommandExit { .. } | Checker::Wasi { .. } => Verdict::NeedsSandbox,
        }
    }
}
