//! The grammar of the toolbox shell (the `shell` tool): a command line is lexed into words
//! and operators, then parsed into pipelines joined by `;`, `&&` and `||`.
//!
//! Two builds use it: the toolbox itself (`sandbox/toolbox`, for `wasm32-wasip1`), which runs
//! the parsed line, and `corvid-tasks` on the host, which checks that a task pack's
//! `command_exit` line is one the shell parses and whose commands it has. One grammar, so a
//! pack the validator accepts is a line the sandbox runs.
//!
//! Supported: pipelines `|`, lists `;` `&&` `||`, newlines as `;`, redirects `>` `>>` `<`
//! `2>` `2>>` `2>&1`, single and double quotes, backslash escapes, `$?`, `$NAME`, `${NAME}`
//! and `#` comments. Refused with a reason: background jobs `&`, subshells and command
//! substitution (`(`, `)`, `` ` ``), unterminated quotes and misplaced operators.
//!
//! [`text`](bre_to_ere) holds the commands' pure text rules the host simulator shares.

mod text;

pub use text::{bre_to_ere, grep_prefix, leading_number};

/// A piece of a [`Word`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seg {
    /// Literal text, and whether it was quoted (quoted text never globs).
    Lit(String, bool),
    /// `$?`: the exit status of the previous pipeline.
    Status,
    /// `$NAME` or `${NAME}`: an environment variable.
    Var(String),
}

/// One shell word: its pieces in order, joined when the word is expanded.
pub type Word = Vec<Seg>;

#[derive(Debug, Clone)]
enum Tok {
    Word(Word),
    Pipe,
    And,
    Or,
    Semi,
    Out,
    Append,
    In,
    ErrOut,
    ErrAppend,
    ErrToOut,
}

/// A redirect operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedirKind {
    /// `>`
    Out,
    /// `>>`
    Append,
    /// `<`
    In,
    /// `2>`
    ErrOut,
    /// `2>>`
    ErrAppend,
    /// `2>&1`
    ErrToOut,
}

/// A simple command: its words (the first names the command) and its redirects, each with
/// its file name (`None` for `2>&1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    pub words: Vec<Word>,
    pub redirs: Vec<(RedirKind, Option<Word>)>,
}

/// How a pipeline joins the one before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conn {
    /// `;`, a newline, or the start of the line: always runs.
    Seq,
    /// `&&`: runs when the previous pipeline exited 0.
    And,
    /// `||`: runs when the previous pipeline failed.
    Or,
}

/// A parsed command line: pipelines in order, each with how it joins the one before.
pub type Script = Vec<(Conn, Vec<Command>)>;

/// The operator at `i`: `doubled` when the next character repeats it (`||`, `>>`),
/// otherwise `single`; and the characters it takes.
fn single_or_doubled(chars: &[char], i: usize, single: Tok, doubled: Tok) -> (Tok, usize) {
    if chars.get(i + 1) == Some(&chars[i]) {
        (doubled, 2)
    } else {
        (single, 1)
    }
}

/// Splits a command line into words and operators.
fn lex(line: &str) -> Result<Vec<Tok>, String> {
    let chars: Vec<char> = line.chars().collect();
    let mut toks = Vec::new();
    let mut word: Word = Vec::new();
    let mut in_word = false;
    let mut i = 0;
    fn push_lit(word: &mut Word, c: char, quoted: bool) {
        if let Some(Seg::Lit(s, q)) = word.last_mut() {
            if *q == quoted {
                s.push(c);
                return;
            }
        }
        word.push(Seg::Lit(c.to_string(), quoted));
    }
    fn var_at(chars: &[char], i: usize) -> Option<(Seg, usize)> {
        // `chars[i]` is '$'; returns the segment and the chars consumed.
        match chars.get(i + 1) {
            Some('?') => Some((Seg::Status, 2)),
            Some('{') => {
                let end = chars[i + 2..].iter().position(|c| *c == '}')?;
                let name: String = chars[i + 2..i + 2 + end].iter().collect();
                Some((Seg::Var(name), end + 3))
            }
            Some(c) if c.is_ascii_alphabetic() || *c == '_' => {
                let mut j = i + 1;
                while j < chars.len() && (chars[j].is_ascii_alphanumeric() || chars[j] == '_') {
                    j += 1;
                }
                Some((Seg::Var(chars[i + 1..j].iter().collect()), j - i))
            }
            _ => None,
        }
    }
    // The `$` at `i`, inside double quotes or not: a variable, or a literal `$`. Returns the
    // characters it takes.
    fn dollar(chars: &[char], i: usize, word: &mut Word, quoted: bool) -> usize {
        match var_at(chars, i) {
            Some((seg, n)) => {
                word.push(seg);
                n
            }
            None => {
                push_lit(word, '$', quoted);
                1
            }
        }
    }
    macro_rules! end_word {
        () => {
            if in_word {
                toks.push(Tok::Word(std::mem::take(&mut word)));
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
                toks.push(Tok::Semi);
                i += 1;
            }
            '|' | '>' => {
                end_word!();
                let (tok, n) = match c {
                    '|' => single_or_doubled(&chars, i, Tok::Pipe, Tok::Or),
                    _ => single_or_doubled(&chars, i, Tok::Out, Tok::Append),
                };
                toks.push(tok);
                i += n;
            }
            '&' => {
                end_word!();
                if chars.get(i + 1) == Some(&'&') {
                    toks.push(Tok::And);
                    i += 2;
                } else {
                    return Err("background jobs (`&`) are not supported".into());
                }
            }
            '<' => {
                end_word!();
                toks.push(Tok::In);
                i += 1;
            }
            '2' if !in_word && chars.get(i + 1) == Some(&'>') => {
                if chars.get(i + 2) == Some(&'&') && chars.get(i + 3) == Some(&'1') {
                    toks.push(Tok::ErrToOut);
                    i += 4;
                } else if chars.get(i + 2) == Some(&'>') {
                    toks.push(Tok::ErrAppend);
                    i += 3;
                } else {
                    toks.push(Tok::ErrOut);
                    i += 2;
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
                let s: String = chars[i + 1..i + 1 + end].iter().collect();
                word.push(Seg::Lit(s, true));
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
                            push_lit(&mut word, chars[i + 1], true);
                            i += 2;
                        }
                        '$' => i += dollar(&chars, i, &mut word, true),
                        _ => {
                            push_lit(&mut word, c, true);
                            i += 1;
                        }
                    }
                }
                // An empty "" still makes a word.
                word.push(Seg::Lit(String::new(), true));
            }
            '\\' => {
                in_word = true;
                if let Some(&n) = chars.get(i + 1) {
                    if n != '\n' {
                        push_lit(&mut word, n, true);
                    }
                    i += 2;
                } else {
                    i += 1;
                }
            }
            '$' => {
                in_word = true;
                i += dollar(&chars, i, &mut word, false);
            }
            '`' | '(' | ')' => {
                return Err(format!(
                    "`{c}` (subshells and command substitution) is not supported"
                ));
            }
            _ => {
                in_word = true;
                push_lit(&mut word, c, false);
                i += 1;
            }
        }
    }
    if in_word {
        toks.push(Tok::Word(word));
    }
    Ok(toks)
}

fn parse(toks: Vec<Tok>) -> Result<Script, String> {
    let mut out: Vec<(Conn, Vec<Command>)> = Vec::new();
    let mut conn = Conn::Seq;
    let mut pipeline: Vec<Command> = Vec::new();
    let mut cmd = Command {
        words: vec![],
        redirs: vec![],
    };
    let mut it = toks.into_iter().peekable();
    let empty = |c: &Command| c.words.is_empty() && c.redirs.is_empty();
    while let Some(t) = it.next() {
        match t {
            Tok::Word(w) => cmd.words.push(w),
            Tok::Out | Tok::Append | Tok::In | Tok::ErrOut | Tok::ErrAppend => {
                let kind = match t {
                    Tok::Out => RedirKind::Out,
                    Tok::Append => RedirKind::Append,
                    Tok::In => RedirKind::In,
                    Tok::ErrOut => RedirKind::ErrOut,
                    _ => RedirKind::ErrAppend,
                };
                match it.next() {
                    Some(Tok::Word(w)) => cmd.redirs.push((kind, Some(w))),
                    _ => return Err("syntax error: a redirect needs a file name".into()),
                }
            }
            Tok::ErrToOut => cmd.redirs.push((RedirKind::ErrToOut, None)),
            Tok::Pipe => {
                if empty(&cmd) {
                    return Err("syntax error near `|`".into());
                }
                pipeline.push(std::mem::replace(
                    &mut cmd,
                    Command {
                        words: vec![],
                        redirs: vec![],
                    },
                ));
            }
            Tok::And | Tok::Or | Tok::Semi => {
                let is_semi = matches!(t, Tok::Semi);
                if empty(&cmd) {
                    if !pipeline.is_empty() || !is_semi {
                        return Err("syntax error near an operator".into());
                    }
                } else {
                    pipeline.push(std::mem::replace(
                        &mut cmd,
                        Command {
                            words: vec![],
                            redirs: vec![],
                        },
                    ));
                    out.push((conn, std::mem::take(&mut pipeline)));
                }
                conn = match t {
                    Tok::And => Conn::And,
                    Tok::Or => Conn::Or,
                    _ => Conn::Seq,
                };
            }
        }
    }
    if empty(&cmd) {
        if !pipeline.is_empty() || conn != Conn::Seq {
            return Err("syntax error: unexpected end of command".into());
        }
    } else {
        pipeline.push(cmd);
        out.push((conn, pipeline));
    }
    Ok(out)
}

/// Parses a command line, or says why the shell refuses it (the message the shell prints
/// after `sh: `, exiting 2 without running anything).
pub fn parse_line(line: &str) -> Result<Script, String> {
    lex(line).and_then(parse)
}

/// The text of `word` when it is fixed before the line runs: no variable or `$?`, and no
/// unquoted glob (`*`, `?`, or a `[…]` class) that could expand to file names. A lone `[`,
/// as in `[ -f x ]`, matches nothing and runs as itself, so it is fixed text.
pub fn static_text(word: &Word) -> Option<String> {
    let mut text = String::new();
    for seg in word {
        let Seg::Lit(s, quoted) = seg else {
            return None;
        };
        for c in s.chars() {
            let class_end = c == ']' && text.contains('[');
            if !quoted && (matches!(c, '*' | '?') || class_end) {
                return None;
            }
            text.push(c);
        }
    }
    Some(text)
}
