//! The small shell behind the `shell` tool: running a command line with
//! pipelines `|`, lists `;` `&&` `||`, redirects `>` `>>` `<` `2>` `2>>`
//! `2>&1`, quoting, globbing and `$?`. Its grammar is `corvid-shell-syntax`
//! (`syntax/`), which the host's task-pack validator parses lines with too.
//!
//! Every command runs inside this one wasm instance; a pipeline stage's
//! output is buffered (bounded by [`MAX_PIPE_BYTES`]) and becomes the next
//! stage's input. Nothing here can start a process: there is none to start.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};

use corvid_shell_syntax::{parse_line, Command, Conn, RedirKind, Seg, Word};

use crate::cmds;
use crate::glob;

/// Most bytes one pipeline stage may hand to the next.
pub const MAX_PIPE_BYTES: usize = 16 << 20;
/// Most bytes one redirect may write into a file (the host's workspace quota
/// is the global bound; this keeps a single command from racing past it).
pub const MAX_REDIRECT_BYTES: usize = 32 << 20;
/// Longest command line accepted.
const MAX_LINE_BYTES: usize = 64 << 10;

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
    let script = match parse_line(line) {
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
