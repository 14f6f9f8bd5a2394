//! The command set. Each command reads its input from files or the bytes
//! handed in, writes to `out`, reports problems on `err`, and returns a
//! conventional exit status (0 ok, 1 "no"/failure, 2 usage, 127 unknown).
//!
//! This file holds what the commands share: [`Io`], the dispatch table, the
//! flag parser, the input helpers, and the translation of POSIX regular
//! expressions into regex-lite's syntax that grep and sed both use. The
//! commands themselves live one family to a file:
//!
//! - `files.rs`: cat, head, tail, wc, ls, mkdir, rm, cp, mv, touch, find,
//!   pwd, cd, basename, dirname, diff
//! - `grep.rs`: grep
//! - `sed.rs`: sed (its script parser and its line runner)
//! - `text.rs`: sort, uniq, cut, tr, echo, printf, seq
//! - `arith.rs`: expr, calc
//! - `python.rs`: python, python3 (run by the host)
//!
//! `true`, `false` and `help` are answered by the dispatch table itself.

mod arith;
mod files;
mod grep;
mod python;
mod sed;
mod text;

use std::fs;
use std::io::{self, Write};

use corvid_shell_syntax::bre_to_ere;
use regex_lite::{Regex, RegexBuilder};

use arith::{calc_cmd, expr};
use files::{
    basename, cat, cd, cp, diff, dirname, find, head_tail, ls, mkdir, mv, pwd, rm, touch, wc,
};
use grep::grep;
use python::python;
use sed::sed;
use text::{cut, echo, printf, seq, sort, tr, uniq};

/// Status of a command that does not exist.
pub const NOT_FOUND: i32 = 127;

/// Every command the toolbox knows, for `help`.
pub const COMMANDS: &[&str] = &[
    "basename", "calc", "cat", "cd", "cp", "cut", "diff", "dirname", "echo", "expr", "false",
    "find", "grep", "head", "help", "ls", "mkdir", "mv", "printf", "pwd", "python", "python3",
    "rm", "sed", "seq", "sort", "tail", "touch", "tr", "true", "uniq", "wc",
];

/// Input, output and error sinks of one command.
pub struct Io<'a> {
    input: &'a [u8],
    out: &'a mut dyn Write,
    err: Option<&'a mut dyn Write>,
    name: &'a str,
}

impl Io<'_> {
    fn err(&mut self, msg: impl std::fmt::Display) {
        let name = self.name;
        let w: &mut dyn Write = match self.err.as_deref_mut() {
            Some(e) => e,
            None => &mut *self.out,
        };
        let _ = writeln!(w, "{name}: {msg}");
    }
    fn usage(&mut self, msg: &str) -> io::Result<i32> {
        self.err(format!("usage: {msg}"));
        Ok(2)
    }
}

/// A short, stable message for an I/O error (never Rust's debug text).
pub fn errmsg(e: &io::Error) -> &'static str {
    use io::ErrorKind as K;
    match e.kind() {
        K::NotFound => "No such file or directory",
        K::PermissionDenied => "Permission denied",
        K::AlreadyExists => "File exists",
        K::IsADirectory => "Is a directory",
        K::NotADirectory => "Not a directory",
        K::DirectoryNotEmpty => "Directory not empty",
        K::InvalidInput | K::InvalidFilename => "Invalid argument",
        K::ReadOnlyFilesystem => "Read-only file system",
        K::StorageFull | K::QuotaExceeded => "No space left on device",
        K::FileTooLarge => "File too large",
        K::Unsupported => "Operation not supported",
        K::Other if e.to_string() == "pipe buffer full" => "pipe buffer full",
        K::Other if e.to_string() == "file too large" => "File too large",
        _ => match e.raw_os_error() {
            Some(76) | Some(63) => "Permission denied",
            Some(32) => "Too many levels of symbolic links",
            Some(33) => "Too many open files",
            Some(37) => "File name too long",
            _ => "Input/output error",
        },
    }
}

/// Runs one command. `err: None` sends errors to `out` (`2>&1`).
pub fn dispatch<'a>(
    argv: &'a [String],
    input: &'a [u8],
    out: &'a mut dyn Write,
    err: Option<&'a mut dyn Write>,
) -> i32 {
    let Some(name) = argv.first() else { return 0 };
    let args = &argv[1..];
    let mut io = Io {
        input,
        out,
        err,
        name,
    };
    let r = match name.as_str() {
        "basename" => basename(&mut io, args),
        "calc" => calc_cmd(&mut io, args),
        "cat" => cat(&mut io, args),
        "cd" => cd(&mut io, args),
        "cp" => cp(&mut io, args),
        "cut" => cut(&mut io, args),
        "diff" => diff(&mut io, args),
        "dirname" => dirname(&mut io, args),
        "echo" => echo(&mut io, args),
        "expr" => expr(&mut io, args),
        "false" => Ok(1),
        "find" => find(&mut io, args),
        "grep" => grep(&mut io, args),
        "head" => head_tail(&mut io, args, true),
        "help" => {
            let _ = writeln!(io.out, "commands: {}", COMMANDS.join(" "));
            Ok(0)
        }
        "ls" => ls(&mut io, args),
        "mkdir" => mkdir(&mut io, args),
        "mv" => mv(&mut io, args),
        "printf" => printf(&mut io, args),
        "pwd" => pwd(&mut io),
        "python" | "python3" => python(&mut io, args),
        "rm" => rm(&mut io, args),
        "sed" => sed(&mut io, args),
        "seq" => seq(&mut io, args),
        "sort" => sort(&mut io, args),
        "tail" => head_tail(&mut io, args, false),
        "touch" => touch(&mut io, args),
        "tr" => tr(&mut io, args),
        "true" => Ok(0),
        "uniq" => uniq(&mut io, args),
        "wc" => wc(&mut io, args),
        _ => {
            let shown: String = name.chars().take(64).collect();
            let w: &mut dyn Write = match io.err.as_deref_mut() {
                Some(e) => e,
                None => &mut *io.out,
            };
            let _ = writeln!(w, "sh: {shown}: command not found (try `help`)");
            return NOT_FOUND;
        }
    };
    let r = r.and_then(|code| io.out.flush().map(|_| code));
    match r {
        Ok(code) => code,
        Err(e) => {
            io.err(format!("write error: {}", errmsg(&e)));
            1
        }
    }
}

// ------------------------------------------------------------------ helpers

/// Parsed flags (each with its value, empty for a plain flag) and operands.
type Opts = (Vec<(char, String)>, Vec<String>);

/// Splits `-abc` style flags; returns (flags, operands). `with_value` flags take
/// the next argument (or the rest of the cluster) as their value.
fn getopt(args: &[String], with_value: &str) -> Result<Opts, String> {
    let mut flags = Vec::new();
    let mut rest = Vec::new();
    let mut i = 0;
    let mut only_operands = false;
    while i < args.len() {
        let a = &args[i];
        if only_operands || !a.starts_with('-') || a == "-" || a.len() < 2 {
            rest.push(a.clone());
            i += 1;
            continue;
        }
        if a == "--" {
            only_operands = true;
            i += 1;
            continue;
        }
        let cs: Vec<char> = a[1..].chars().collect();
        let mut j = 0;
        while j < cs.len() {
            let c = cs[j];
            if with_value.contains(c) {
                let v: String = cs[j + 1..].iter().collect();
                if !v.is_empty() {
                    flags.push((c, v));
                } else {
                    i += 1;
                    let v = args.get(i).ok_or(format!("option -{c} needs a value"))?;
                    flags.push((c, v.clone()));
                }
                break;
            }
            flags.push((c, String::new()));
            j += 1;
        }
        i += 1;
    }
    Ok((flags, rest))
}

fn has(flags: &[(char, String)], c: char) -> bool {
    flags.iter().any(|(f, _)| *f == c)
}

fn value(flags: &[(char, String)], c: char) -> Option<&str> {
    flags
        .iter()
        .rev()
        .find(|(f, _)| *f == c)
        .map(|(_, v)| v.as_str())
}

fn unknown_flag(io: &mut Io, flags: &[(char, String)], known: &str) -> Option<io::Result<i32>> {
    let bad = flags.iter().find(|(f, _)| !known.contains(*f))?;
    io.err(format!("invalid option -- '{}'", bad.0));
    Some(Ok(2))
}

/// Reads every input: the named files, or stdin when none (or `-`).
fn inputs(io: &mut Io, files: &[String]) -> Vec<(String, Vec<u8>)> {
    if files.is_empty() {
        return vec![("-".into(), io.input.to_vec())];
    }
    let mut v = Vec::new();
    for f in files {
        if f == "-" {
            v.push((f.clone(), io.input.to_vec()));
            continue;
        }
        match fs::read(f) {
            Ok(b) => v.push((f.clone(), b)),
            Err(e) => io.err(format!("{f}: {}", errmsg(&e))),
        }
    }
    v
}

fn lines(b: &[u8]) -> Vec<&[u8]> {
    if b.is_empty() {
        return vec![];
    }
    let b = b.strip_suffix(b"\n").unwrap_or(b);
    b.split(|c| *c == b'\n').collect()
}

fn write_line(out: &mut dyn Write, l: &[u8]) -> io::Result<()> {
    out.write_all(l)?;
    out.write_all(b"\n")
}

// ------------------------------------------------------------------ regex

fn build_regex(p: &str, extended: bool, icase: bool) -> Result<Regex, String> {
    let src = if extended {
        p.to_string()
    } else {
        bre_to_ere(p)
    };
    RegexBuilder::new(&src)
        .case_insensitive(icase)
        .size_limit(1 << 20)
        .build()
        .map_err(|_| format!("invalid regular expression '{p}'"))
}
