//! The small shell behind the `shell` tool: lexing, parsing and running a
//! command line with pipelines `|`, lists `;` `&&` `||`, redirects `>` `>>`
//! `<` `2>` `2>>` `2>&1`, quoting, globbing and `$?`.
//!
//! Every command runs inside this one wasm instance; a pipeline stage's
//! output is buffered (bounded by [`MAX_PIPE_BYTES`]) and becomes the next
//! stage's input. Nothing here can start a process: there is none to start.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};

use crate::cmds;
use crate::glob;

/// Most bytes one pipeline stage may hand to the next.
pub const MAX_PIPE_BYTES: usize = 16 << 20;
/// Most bytes one redirect may write into a file (the host's workspace quota
/// is the global bound; this keeps a single command from racing past it).
pub const MAX_REDIRECT_BYTES: usize = 32 << 20;
/// Longest command line accepted.
const MAX_LINE_BYTES: usize = 64 << 10;

#[derive(Debug, Clone)]
enum Seg {
    Lit(String, bool),
    Status,
    Var(String),
}

type Word = Vec<Seg>;

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

#[derive(Debug, Clone, Copy)]
enum RedirKind {
    Out,
    Append,
    In,
    ErrOut,
    ErrAppend,
    ErrToOut,
}

#[derive(Debug)]
struct Command {
    words: Vec<Word>,
    redirs: Vec<(RedirKind, Option<Word>)>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Conn {
    Seq,
    And,
    Or,
}

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
            '|' => {
                end_word!();
                if chars.get(i + 1) == Some(&'|') {
                    toks.push(Tok::Or);
                    i += 2;
                } else {
                    toks.push(Tok::Pipe);
                    i += 1;
                }
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
            '>' => {
                end_word!();
                if chars.get(i + 1) == Some(&'>') {
                    toks.push(Tok::Append);
                    i += 2;
                } else {
                    toks.push(Tok::Out);
                    i += 1;
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
                        '$' => match var_at(&chars, i) {
                            Some((seg, n)) => {
                                word.push(seg);
                                i += n;
                            }
                            None => {
                                push_lit(&mut word, '$', true);
                                i += 1;
                            }
                        },
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
                match var_at(&chars, i) {
                    Some((seg, n)) => {
                        word.push(seg);
                        i += n;
                    }
                    None => {
                        push_lit(&mut word, '$', false);
                        i += 1;
                    }
                }
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

fn parse(toks: Vec<Tok>) -> Result<Vec<(Conn, Vec<Command>)>, String> {
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

/// Expands one word: variables, then globbing if it holds an unquoted wildcard.
fn expand_word(w: &Word, status: i32, glob_ok: bool) -> Vec<String> {
    let mut text = String::new();
    let mut pat = String::new();
    let mut meta = false;
    for seg in w {
        let (s, quoted) = match seg {
            Seg::Lit(s, q) => (s.clone(), *q),
            Seg::Status => (status.to_string(), true),
            Seg::Var(name) => (std::env::var(name).unwrap_or_default(), true),
        };
        for c in s.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') && quoted {
                pat.push('\\');
            } else if matches!(c, '*' | '?' | '[') {
                meta = true;
            }
            pat.push(c);
            text.push(c);
        }
    }
    // An unquoted expansion to nothing is no word at all (`echo $UNSET`).
    let quoted_or_literal = w
        .iter()
        .any(|s| matches!(s, Seg::Lit(l, q) if *q || !l.is_empty()));
    if text.is_empty() && !quoted_or_literal {
        return Vec::new();
    }
    if glob_ok && meta {
        let found = glob::expand(&pat);
        if !found.is_empty() {
            return found;
        }
    }
    vec![text]
}

/// A writer that refuses to grow past a cap (pipes between stages).
pub struct Capped {
    pub buf: Vec<u8>,
    cap: usize,
}

impl Write for Capped {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        if self.buf.len() + b.len() > self.cap {
            return Err(io::Error::other("pipe buffer full"));
        }
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A file writer that stops at [`MAX_REDIRECT_BYTES`]; `None` is `/dev/null`.
struct CappedFile {
    f: Option<io::BufWriter<File>>,
    written: usize,
}

impl Write for CappedFile {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        let Some(f) = self.f.as_mut() else {
            return Ok(b.len());
        };
        if self.written + b.len() > MAX_REDIRECT_BYTES {
            return Err(io::Error::other("file too large"));
        }
        self.written += b.len();
        f.write_all(b)?;
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        match self.f.as_mut() {
            Some(f) => f.flush(),
            None => Ok(()),
        }
    }
}

/// The one device the shell knows: reads as empty, swallows writes.
const DEV_NULL: &str = "/dev/null";

fn open_out(path: &str, append: bool) -> io::Result<CappedFile> {
    if path == DEV_NULL {
        return Ok(CappedFile {
            f: None,
            written: 0,
        });
    }
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .append(append)
        .truncate(!append)
        .open(path)?;
    Ok(CappedFile {
        f: Some(io::BufWriter::new(f)),
        written: 0,
    })
}

/// Runs a full command line; returns the exit status of the last pipeline.
pub fn run_line(line: &str, stdin: &[u8], stdout: &mut dyn Write, stderr: &mut dyn Write) -> i32 {
    if line.len() > MAX_LINE_BYTES {
        let _ = writeln!(
            stderr,
            "sh: command line longer than {MAX_LINE_BYTES} bytes"
        );
        return 2;
    }
    let script = match lex(line).and_then(parse) {
        Ok(s) => s,
        Err(e) => {
            let _ = writeln!(stderr, "sh: {e}");
            return 2;
        }
    };
    let mut status = 0;
    for (conn, pipeline) in &script {
        match conn {
            Conn::And if status != 0 => continue,
            Conn::Or if status == 0 => continue,
            _ => {}
        }
        status = run_pipeline(pipeline, status, stdin, stdout, stderr);
    }
    status
}

fn run_pipeline(
    pipeline: &[Command],
    status: i32,
    stdin: &[u8],
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> i32 {
    let mut input: Vec<u8> = stdin.to_vec();
    let mut last = 0;
    for (i, cmd) in pipeline.iter().enumerate() {
        let is_last = i + 1 == pipeline.len();
        let mut argv: Vec<String> = Vec::new();
        for w in &cmd.words {
            argv.extend(expand_word(w, status, true));
        }
        let mut pipe = Capped {
            buf: Vec::new(),
            cap: MAX_PIPE_BYTES,
        };
        let mut out_file: Option<CappedFile> = None;
        let mut err_file: Option<CappedFile> = None;
        let mut err_to_out = false;
        let mut redir_failed = false;
        for (kind, target) in &cmd.redirs {
            let target = target
                .as_ref()
                .map(|w| expand_word(w, status, false).join(" "));
            let target = target.unwrap_or_default();
            let r = match kind {
                RedirKind::In if target == DEV_NULL => {
                    input.clear();
                    Ok(())
                }
                RedirKind::In => std::fs::read(&target).map(|b| input = b),
                RedirKind::Out | RedirKind::Append => {
                    open_out(&target, matches!(kind, RedirKind::Append)).map(|f| out_file = Some(f))
                }
                RedirKind::ErrOut | RedirKind::ErrAppend => {
                    open_out(&target, matches!(kind, RedirKind::ErrAppend))
                        .map(|f| err_file = Some(f))
                }
                RedirKind::ErrToOut => {
                    err_to_out = true;
                    Ok(())
                }
            };
            if let Err(e) = r {
                let _ = writeln!(stderr, "sh: {target}: {}", cmds::errmsg(&e));
                redir_failed = true;
                break;
            }
        }
        if redir_failed {
            last = 1;
            input.clear();
            continue;
        }
        let code = {
            let out: &mut dyn Write = match out_file.as_mut() {
                Some(f) => f,
                None if is_last => &mut *stdout,
                None => &mut pipe,
            };
            if err_to_out {
                cmds::dispatch(&argv, &input, out, None)
            } else {
                let err: &mut dyn Write = match err_file.as_mut() {
                    Some(f) => f,
                    None => &mut *stderr,
                };
                cmds::dispatch(&argv, &input, out, Some(err))
            }
        };
        if let Some(mut f) = out_file {
            let _ = f.flush();
        }
        if let Some(mut f) = err_file {
            let _ = f.flush();
        }
        last = code;
        input = pipe.buf;
    }
    last
}
