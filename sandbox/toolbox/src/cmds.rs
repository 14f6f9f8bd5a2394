//! The command set. Each command reads its input from files or the bytes
//! handed in, writes to `out`, reports problems on `err`, and returns a
//! conventional exit status (0 ok, 1 "no"/failure, 2 usage, 127 unknown).

use std::fs;
use std::io::{self, Write};
use std::path::Path;

use regex_lite::{Regex, RegexBuilder};

use crate::dir;
use crate::glob;

/// Status of a command that does not exist.
pub const NOT_FOUND: i32 = 127;

/// Every command the toolbox knows, for `help`.
pub const COMMANDS: &[&str] = &[
    "basename", "calc", "cat", "cd", "cp", "cut", "diff", "dirname", "echo", "expr", "false",
    "find", "grep", "head", "help", "ls", "mkdir", "mv", "printf", "pwd", "rm", "sed", "seq",
    "sort", "tail", "touch", "tr", "true", "uniq", "wc",
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

fn parse_num(s: &str) -> Option<i64> {
    s.trim().parse().ok()
}

// ------------------------------------------------------------------ files

fn cat(io: &mut Io, args: &[String]) -> io::Result<i32> {
    let (flags, files) = match getopt(args, "") {
        Ok(x) => x,
        Err(e) => return io.usage(&e),
    };
    if let Some(r) = unknown_flag(io, &flags, "n") {
        return r;
    }
    let number = has(&flags, 'n');
    let mut code = 0;
    let mut n = 0;
    let names: Vec<String> = if files.is_empty() {
        vec!["-".into()]
    } else {
        files
    };
    for f in &names {
        let data = if f == "-" {
            io.input.to_vec()
        } else {
            match fs::read(f) {
                Ok(b) => b,
                Err(e) => {
                    io.err(format!("{f}: {}", errmsg(&e)));
                    code = 1;
                    continue;
                }
            }
        };
        if number {
            for l in lines(&data) {
                n += 1;
                write!(io.out, "{n:6}\t")?;
                write_line(io.out, l)?;
            }
        } else {
            io.out.write_all(&data)?;
        }
    }
    Ok(code)
}

fn head_tail(io: &mut Io, args: &[String], head: bool) -> io::Result<i32> {
    // `-5` is shorthand for `-n 5`.
    let args: Vec<String> = args
        .iter()
        .map(|a| {
            if a.len() > 1 && a.starts_with('-') && a[1..].chars().all(|c| c.is_ascii_digit()) {
                format!("-n{}", &a[1..])
            } else {
                a.clone()
            }
        })
        .collect();
    let (flags, files) = match getopt(&args, "nc") {
        Ok(x) => x,
        Err(e) => return io.usage(&e),
    };
    if let Some(r) = unknown_flag(io, &flags, "nc") {
        return r;
    }
    let spec = value(&flags, 'n').unwrap_or("10").to_string();
    let from_start = spec.starts_with('+');
    let Some(count) = spec.trim_start_matches('+').parse::<usize>().ok() else {
        io.err(format!("invalid number of lines: '{spec}'"));
        return Ok(2);
    };
    let bytes = value(&flags, 'c').and_then(|v| v.parse::<usize>().ok());
    let all = inputs(io, &files);
    let multi = all.len() > 1;
    let mut code = if all.len() < files.len().max(1) { 1 } else { 0 };
    for (i, (name, data)) in all.iter().enumerate() {
        if multi {
            if i > 0 {
                writeln!(io.out)?;
            }
            writeln!(io.out, "==> {name} <==")?;
        }
        if let Some(c) = bytes {
            let c = c.min(data.len());
            let slice = if head {
                &data[..c]
            } else {
                &data[data.len() - c..]
            };
            io.out.write_all(slice)?;
            continue;
        }
        let ls = lines(data);
        let pick: &[&[u8]] = if head {
            &ls[..count.min(ls.len())]
        } else if from_start {
            &ls[count.saturating_sub(1).min(ls.len())..]
        } else {
            &ls[ls.len().saturating_sub(count)..]
        };
        for l in pick {
            write_line(io.out, l)?;
        }
    }
    if code == 0 && all.is_empty() {
        code = 1;
    }
    Ok(code)
}

fn wc(io: &mut Io, args: &[String]) -> io::Result<i32> {
    let (flags, files) = match getopt(args, "") {
        Ok(x) => x,
        Err(e) => return io.usage(&e),
    };
    if let Some(r) = unknown_flag(io, &flags, "lwc") {
        return r;
    }
    let (mut l, mut w, mut c) = (has(&flags, 'l'), has(&flags, 'w'), has(&flags, 'c'));
    if !l && !w && !c {
        (l, w, c) = (true, true, true);
    }
    let all = inputs(io, &files);
    let code = if all.len() < files.len() { 1 } else { 0 };
    let mut tot = (0usize, 0usize, 0usize);
    let show = |out: &mut dyn Write, n: (usize, usize, usize), name: &str| -> io::Result<()> {
        let mut parts = Vec::new();
        if l {
            parts.push(n.0.to_string());
        }
        if w {
            parts.push(n.1.to_string());
        }
        if c {
            parts.push(n.2.to_string());
        }
        if name != "-" {
            parts.push(name.to_string());
        }
        writeln!(out, "{}", parts.join(" "))
    };
    for (name, data) in &all {
        let n = (
            data.iter().filter(|b| **b == b'\n').count(),
            data.split(|b| b.is_ascii_whitespace())
                .filter(|s| !s.is_empty())
                .count(),
            data.len(),
        );
        tot = (tot.0 + n.0, tot.1 + n.1, tot.2 + n.2);
        show(io.out, n, name)?;
    }
    if all.len() > 1 {
        show(io.out, tot, "total")?;
    }
    Ok(code)
}

fn ls(io: &mut Io, args: &[String]) -> io::Result<i32> {
    let (flags, paths) = match getopt(args, "") {
        Ok(x) => x,
        Err(e) => return io.usage(&e),
    };
    if let Some(r) = unknown_flag(io, &flags, "al1R") {
        return r;
    }
    let (all, long, recurse) = (has(&flags, 'a'), has(&flags, 'l'), has(&flags, 'R'));
    let paths = if paths.is_empty() {
        vec![".".to_string()]
    } else {
        paths
    };
    let mut code = 0;
    let mut files = Vec::new();
    let mut dirs = Vec::new();
    for p in &paths {
        match fs::symlink_metadata(p) {
            Ok(m) if m.is_dir() => dirs.push(p.clone()),
            Ok(_) => files.push(p.clone()),
            Err(e) => {
                io.err(format!("cannot access '{p}': {}", errmsg(&e)));
                code = 2;
            }
        }
    }
    for f in &files {
        entry(io, f, f, long)?;
    }
    let headers = dirs.len() + files.len() > 1 || recurse;
    let mut first = files.is_empty();
    let mut queue = dirs;
    while let Some(d) = (!queue.is_empty()).then(|| queue.remove(0)) {
        if headers {
            if !first {
                writeln!(io.out)?;
            }
            writeln!(io.out, "{d}:")?;
        }
        first = false;
        let names: Vec<String> = match dir::names(&d) {
            Ok(v) => v
                .into_iter()
                .filter(|n| all || !n.starts_with('.'))
                .collect(),
            Err(e) => {
                io.err(format!("cannot open directory '{d}': {}", errmsg(&e)));
                code = 2;
                continue;
            }
        };
        let mut sub = Vec::new();
        for n in &names {
            let full = if d == "." {
                n.clone()
            } else {
                format!("{}/{n}", d.trim_end_matches('/'))
            };
            entry(io, &full, n, long)?;
            if recurse
                && fs::symlink_metadata(&full)
                    .map(|m| m.is_dir())
                    .unwrap_or(false)
            {
                sub.push(if d == "." { format!("./{n}") } else { full });
            }
        }
        for (i, s) in sub.into_iter().enumerate() {
            queue.insert(i, s);
        }
    }
    Ok(code)
}

fn entry(io: &mut Io, full: &str, shown: &str, long: bool) -> io::Result<()> {
    if !long {
        return writeln!(io.out, "{shown}");
    }
    match fs::symlink_metadata(full) {
        Ok(m) => {
            let kind = if m.is_dir() {
                'd'
            } else if m.file_type().is_symlink() {
                'l'
            } else {
                '-'
            };
            writeln!(io.out, "{kind} {:>9} {shown}", m.len())
        }
        Err(_) => writeln!(io.out, "? {:>9} {shown}", "?"),
    }
}

fn mkdir(io: &mut Io, args: &[String]) -> io::Result<i32> {
    let (flags, dirs) = match getopt(args, "") {
        Ok(x) => x,
        Err(e) => return io.usage(&e),
    };
    if let Some(r) = unknown_flag(io, &flags, "p") {
        return r;
    }
    if dirs.is_empty() {
        return io.usage("mkdir [-p] DIR...");
    }
    let mut code = 0;
    for d in &dirs {
        let r = if has(&flags, 'p') {
            fs::create_dir_all(d)
        } else {
            fs::create_dir(d)
        };
        if let Err(e) = r {
            io.err(format!("cannot create directory '{d}': {}", errmsg(&e)));
            code = 1;
        }
    }
    Ok(code)
}

fn rm(io: &mut Io, args: &[String]) -> io::Result<i32> {
    let (flags, paths) = match getopt(args, "") {
        Ok(x) => x,
        Err(e) => return io.usage(&e),
    };
    if let Some(r) = unknown_flag(io, &flags, "rRf") {
        return r;
    }
    let recursive = has(&flags, 'r') || has(&flags, 'R');
    let force = has(&flags, 'f');
    if paths.is_empty() && !force {
        return io.usage("rm [-rf] PATH...");
    }
    let mut code = 0;
    for p in &paths {
        let r = match fs::symlink_metadata(p) {
            Ok(m) if m.is_dir() => {
                if recursive {
                    dir::remove_tree(p)
                } else {
                    io.err(format!("cannot remove '{p}': Is a directory"));
                    code = 1;
                    continue;
                }
            }
            Ok(_) => fs::remove_file(p),
            Err(e) => Err(e),
        };
        if let Err(e) = r {
            if !(force && e.kind() == io::ErrorKind::NotFound) {
                io.err(format!("cannot remove '{p}': {}", errmsg(&e)));
                code = 1;
            }
        }
    }
    Ok(code)
}

fn copy_tree(src: &Path, dst: &Path) -> io::Result<()> {
    let m = fs::symlink_metadata(src)?;
    if m.is_dir() {
        fs::create_dir_all(dst)?;
        for n in dir::names(src)? {
            copy_tree(&src.join(&n), &dst.join(&n))?;
        }
        Ok(())
    } else {
        fs::copy(src, dst).map(|_| ())
    }
}

fn cp_mv(io: &mut Io, args: &[String], is_mv: bool) -> io::Result<i32> {
    let (flags, paths) = match getopt(args, "") {
        Ok(x) => x,
        Err(e) => return io.usage(&e),
    };
    if let Some(r) = unknown_flag(io, &flags, if is_mv { "f" } else { "rRf" }) {
        return r;
    }
    if paths.len() < 2 {
        return io.usage(if is_mv {
            "mv SRC... DEST"
        } else {
            "cp [-r] SRC... DEST"
        });
    }
    let (srcs, dst) = paths.split_at(paths.len() - 1);
    let dst = Path::new(&dst[0]);
    let dst_is_dir = fs::metadata(dst).map(|m| m.is_dir()).unwrap_or(false);
    if srcs.len() > 1 && !dst_is_dir {
        io.err(format!("target '{}' is not a directory", dst.display()));
        return Ok(1);
    }
    let recursive = has(&flags, 'r') || has(&flags, 'R');
    let mut code = 0;
    for s in srcs {
        let sp = Path::new(s);
        let target = if dst_is_dir {
            match sp.file_name() {
                Some(n) => dst.join(n),
                None => dst.to_path_buf(),
            }
        } else {
            dst.to_path_buf()
        };
        let r = if is_mv {
            fs::rename(sp, &target)
        } else {
            match fs::symlink_metadata(sp) {
                Ok(m) if m.is_dir() && !recursive => {
                    io.err(format!("-r not specified; omitting directory '{s}'"));
                    code = 1;
                    continue;
                }
                Ok(_) => copy_tree(sp, &target),
                Err(e) => Err(e),
            }
        };
        if let Err(e) = r {
            io.err(format!(
                "cannot {} '{s}': {}",
                if is_mv { "move" } else { "copy" },
                errmsg(&e)
            ));
            code = 1;
        }
    }
    Ok(code)
}

fn cp(io: &mut Io, args: &[String]) -> io::Result<i32> {
    cp_mv(io, args, false)
}

fn mv(io: &mut Io, args: &[String]) -> io::Result<i32> {
    cp_mv(io, args, true)
}

fn touch(io: &mut Io, args: &[String]) -> io::Result<i32> {
    if args.is_empty() {
        return io.usage("touch FILE...");
    }
    let mut code = 0;
    for f in args {
        if let Err(e) = fs::OpenOptions::new().create(true).append(true).open(f) {
            io.err(format!("cannot touch '{f}': {}", errmsg(&e)));
            code = 1;
        }
    }
    Ok(code)
}

fn find(io: &mut Io, args: &[String]) -> io::Result<i32> {
    let mut roots = Vec::new();
    let mut i = 0;
    while i < args.len() && !args[i].starts_with('-') {
        roots.push(args[i].clone());
        i += 1;
    }
    if roots.is_empty() {
        roots.push(".".into());
    }
    let (mut name, mut iname, mut kind, mut maxdepth) = (None, None, None, usize::MAX);
    while i < args.len() {
        let v = args.get(i + 1).cloned();
        match (args[i].as_str(), v) {
            ("-name", Some(v)) => name = Some(v),
            ("-iname", Some(v)) => iname = Some(v.to_lowercase()),
            ("-type", Some(v)) if v == "f" || v == "d" => kind = Some(v),
            ("-maxdepth", Some(v)) => match v.parse() {
                Ok(n) => maxdepth = n,
                Err(_) => return io.usage("find [PATH...] [-name GLOB] [-type f|d] [-maxdepth N]"),
            },
            _ => {
                io.err(format!("unknown or incomplete predicate '{}'", args[i]));
                return Ok(2);
            }
        }
        i += 2;
    }
    let mut code = 0;
    for root in roots {
        let mut stack = vec![(root.clone(), 0usize)];
        if fs::symlink_metadata(&root).is_err() {
            io.err(format!("'{root}': No such file or directory"));
            code = 1;
            continue;
        }
        while let Some((p, depth)) = stack.pop() {
            let m = match fs::symlink_metadata(&p) {
                Ok(m) => m,
                Err(_) => continue,
            };
            let base = p.rsplit('/').next().unwrap_or(&p).to_string();
            let ok_name = name.as_ref().is_none_or(|g| glob::matches(g, &base))
                && iname
                    .as_ref()
                    .is_none_or(|g| glob::matches(g, &base.to_lowercase()));
            let ok_kind = match kind.as_deref() {
                Some("f") => m.is_file(),
                Some("d") => m.is_dir(),
                _ => true,
            };
            if ok_name && ok_kind {
                writeln!(io.out, "{p}")?;
            }
            if m.is_dir() && depth < maxdepth {
                let names = match dir::names(&p) {
                    Ok(v) => v,
                    Err(e) => {
                        io.err(format!("'{p}': {}", errmsg(&e)));
                        code = 1;
                        continue;
                    }
                };
                for n in names.into_iter().rev() {
                    stack.push((format!("{}/{n}", p.trim_end_matches('/')), depth + 1));
                }
            }
        }
    }
    Ok(code)
}

fn pwd(io: &mut Io) -> io::Result<i32> {
    let d = std::env::current_dir()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "/workspace".into());
    writeln!(io.out, "{d}")?;
    Ok(0)
}

fn cd(io: &mut Io, args: &[String]) -> io::Result<i32> {
    let target = args.first().map(String::as_str).unwrap_or("/workspace");
    match std::env::set_current_dir(target) {
        Ok(()) => Ok(0),
        Err(e) => {
            io.err(format!("{target}: {}", errmsg(&e)));
            Ok(1)
        }
    }
}

fn basename(io: &mut Io, args: &[String]) -> io::Result<i32> {
    let Some(p) = args.first() else {
        return io.usage("basename PATH [SUFFIX]");
    };
    let t = p.trim_end_matches('/');
    let mut b = if t.is_empty() && !p.is_empty() {
        "/"
    } else {
        t.rsplit('/').next().unwrap_or(t)
    }
    .to_string();
    if let Some(s) = args.get(1) {
        if b.len() > s.len() && b.ends_with(s.as_str()) {
            b.truncate(b.len() - s.len());
        }
    }
    writeln!(io.out, "{b}")?;
    Ok(0)
}

fn dirname(io: &mut Io, args: &[String]) -> io::Result<i32> {
    let Some(p) = args.first() else {
        return io.usage("dirname PATH");
    };
    let t = p.trim_end_matches('/');
    let d = match t.rfind('/') {
        Some(0) => "/".to_string(),
        Some(i) => t[..i].trim_end_matches('/').to_string(),
        None if p.starts_with('/') => "/".into(),
        None => ".".into(),
    };
    writeln!(io.out, "{d}")?;
    Ok(0)
}

fn diff(io: &mut Io, args: &[String]) -> io::Result<i32> {
    if args.len() != 2 {
        return io.usage("diff FILE1 FILE2");
    }
    let all = inputs(io, args);
    if all.len() != 2 {
        return Ok(2);
    }
    let (a, b) = (lines(&all[0].1), lines(&all[1].1));
    if a == b {
        return Ok(0);
    }
    writeln!(io.out, "--- {}\n+++ {}", args[0], args[1])?;
    // Trim the common head and tail, then an LCS table over what is left
    // (bounded: beyond 4M cells print a whole-block replacement).
    let pre = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let suf = a[pre..]
        .iter()
        .rev()
        .zip(b[pre..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let (am, bm) = (&a[pre..a.len() - suf], &b[pre..b.len() - suf]);
    writeln!(
        io.out,
        "@@ -{},{} +{},{} @@",
        pre + 1,
        am.len(),
        pre + 1,
        bm.len()
    )?;
    if am.len().saturating_mul(bm.len()) > 4_000_000 {
        for l in am {
            io.out.write_all(b"-")?;
            write_line(io.out, l)?;
        }
        for l in bm {
            io.out.write_all(b"+")?;
            write_line(io.out, l)?;
        }
        return Ok(1);
    }
    let (n, m) = (am.len(), bm.len());
    let mut t = vec![0u32; (n + 1) * (m + 1)];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            t[i * (m + 1) + j] = if am[i] == bm[j] {
                t[(i + 1) * (m + 1) + j + 1] + 1
            } else {
                t[(i + 1) * (m + 1) + j].max(t[i * (m + 1) + j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        if i < n && j < m && am[i] == bm[j] {
            io.out.write_all(b" ")?;
            write_line(io.out, am[i])?;
            i += 1;
            j += 1;
        } else if i < n && (j == m || t[(i + 1) * (m + 1) + j] >= t[i * (m + 1) + j + 1]) {
            io.out.write_all(b"-")?;
            write_line(io.out, am[i])?;
            i += 1;
        } else {
            io.out.write_all(b"+")?;
            write_line(io.out, bm[j])?;
            j += 1;
        }
    }
    Ok(1)
}

// ------------------------------------------------------------------ text

/// Translates a POSIX basic regular expression to the extended syntax.
fn bre_to_ere(p: &str) -> String {
    let mut out = String::new();
    let mut it = p.chars().peekable();
    while let Some(c) = it.next() {
        match c {
            '\\' => match it.next() {
                Some(n @ ('(' | ')' | '|' | '{' | '}' | '+' | '?')) => out.push(n),
                Some(n) => {
                    out.push('\\');
                    out.push(n);
                }
                None => out.push_str("\\\\"),
            },
            '(' | ')' | '|' | '{' | '}' | '+' | '?' => {
                out.push('\\');
                out.push(c);
            }
            _ => out.push(c),
        }
    }
    out
}

/// `pattern` itself when it is a non-empty literal: taken as is by `-F`,
/// or free of every BRE and ERE metacharacter (so the regex built from it
/// matches exactly the lines that contain it).
fn plain_literal(pattern: &str, fixed: bool) -> Option<&str> {
    let plain = fixed || !pattern.chars().any(|c| "\\.[]*^$+?(){}|".contains(c));
    (plain && !pattern.is_empty()).then_some(pattern)
}

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

fn walk_files(root: &str, out: &mut Vec<String>) {
    match fs::symlink_metadata(root) {
        Ok(m) if m.is_dir() => {
            for n in dir::names(root).unwrap_or_default() {
                let p = if root == "." {
                    n
                } else {
                    format!("{}/{n}", root.trim_end_matches('/'))
                };
                walk_files(&p, out);
            }
        }
        Ok(m) if m.is_file() => out.push(root.to_string()),
        _ => {}
    }
}

fn grep(io: &mut Io, args: &[String]) -> io::Result<i32> {
    let (flags, mut rest) = match getopt(args, "e") {
        Ok(x) => x,
        Err(e) => return io.usage(&e),
    };
    if let Some(r) = unknown_flag(io, &flags, "nivcrRElhoweFH") {
        return r;
    }
    let pattern = match value(&flags, 'e') {
        Some(p) => p.to_string(),
        None if !rest.is_empty() => rest.remove(0),
        None => return io.usage("grep [-nivcrElhowF] PATTERN [FILE...]"),
    };
    let pat = if has(&flags, 'F') {
        let mut s = String::new();
        for c in pattern.chars() {
            if "\\.+*?()|[]{}^$".contains(c) {
                s.push('\\');
            }
            s.push(c);
        }
        s
    } else {
        pattern.clone()
    };
    let pat = if has(&flags, 'w') {
        format!(
            r"\b(?:{})\b",
            if has(&flags, 'E') || has(&flags, 'F') {
                pat
            } else {
                bre_to_ere(&pat)
            }
        )
    } else {
        pat
    };
    let extended = has(&flags, 'E') || has(&flags, 'F') || has(&flags, 'w');
    let re = match build_regex(&pat, extended, has(&flags, 'i')) {
        Ok(r) => r,
        Err(e) => {
            io.err(e);
            return Ok(2);
        }
    };
    let recursive = has(&flags, 'r') || has(&flags, 'R');
    let mut files = rest;
    if recursive {
        let roots = if files.is_empty() {
            vec![".".to_string()]
        } else {
            files
        };
        files = Vec::new();
        for r in roots {
            if fs::symlink_metadata(&r).is_err() {
                io.err(format!("{r}: No such file or directory"));
                continue;
            }
            walk_files(&r, &mut files);
        }
    }
    let multi = (files.len() > 1 || recursive || has(&flags, 'H')) && !has(&flags, 'h');
    let mut missing = false;
    let all = if files.is_empty() && !recursive {
        vec![("(standard input)".to_string(), io.input.to_vec())]
    } else {
        let v = inputs(io, &files);
        missing = v.len() < files.len();
        v
    };
    let (invert, count, list, number, only) = (
        has(&flags, 'v'),
        has(&flags, 'c'),
        has(&flags, 'l'),
        has(&flags, 'n'),
        has(&flags, 'o'),
    );
    // regex-lite has no literal prefilter: it runs its NFA from every byte
    // (~800 wasm instructions per byte of input). A case-sensitive plain
    // literal is matched with a substring search instead, and with `-w` the
    // regex runs only on lines that contain the literal.
    let literal = if has(&flags, 'i') {
        None
    } else {
        plain_literal(&pattern, has(&flags, 'F'))
    };
    let literal_decides = literal.is_some() && !has(&flags, 'w');
    let mut any = false;
    for (name, data) in &all {
        let mut n = 0usize;
        for (i, l) in lines(data).into_iter().enumerate() {
            let text = String::from_utf8_lossy(l);
            let matched = match literal {
                Some(lit) if !text.contains(lit) => false,
                Some(_) if literal_decides => true,
                _ => re.is_match(&text),
            };
            let hit = matched != invert;
            if !hit {
                continue;
            }
            n += 1;
            any = true;
            if count || list {
                if list {
                    break;
                }
                continue;
            }
            let prefix = match (multi, number) {
                (true, true) => format!("{name}:{}:", i + 1),
                (true, false) => format!("{name}:"),
                (false, true) => format!("{}:", i + 1),
                (false, false) => String::new(),
            };
            if only && !invert {
                for m in re.find_iter(&text).filter(|m| !m.as_str().is_empty()) {
                    writeln!(io.out, "{prefix}{}", m.as_str())?;
                }
            } else {
                io.out.write_all(prefix.as_bytes())?;
                write_line(io.out, l)?;
            }
        }
        if list && n > 0 {
            writeln!(io.out, "{name}")?;
        } else if count {
            if multi {
                writeln!(io.out, "{name}:{n}")?;
            } else {
                writeln!(io.out, "{n}")?;
            }
        }
    }
    Ok(if missing {
        2
    } else if any {
        0
    } else {
        1
    })
}

enum Addr {
    Line(usize),
    Last,
    Re(Regex),
}

enum SedCmd {
    Subst {
        re: Regex,
        rep: String,
        global: bool,
        print: bool,
    },
    Print,
    Delete,
    Quit,
    LineNo,
}

struct SedRule {
    a1: Option<Addr>,
    a2: Option<Addr>,
    cmd: SedCmd,
    active: bool,
}

fn sed_parse(script: &str) -> Result<Vec<SedRule>, String> {
    let cs: Vec<char> = script.chars().collect();
    let mut i = 0;
    let mut rules = Vec::new();
    let bad = || format!("cannot parse script '{script}'");
    fn addr(cs: &[char], i: &mut usize) -> Result<Option<Addr>, String> {
        match cs.get(*i) {
            Some(c) if c.is_ascii_digit() => {
                let s = *i;
                while *i < cs.len() && cs[*i].is_ascii_digit() {
                    *i += 1;
                }
                let n: String = cs[s..*i].iter().collect();
                Ok(Some(Addr::Line(
                    n.parse().map_err(|_| "bad line number".to_string())?,
                )))
            }
            Some('$') => {
                *i += 1;
                Ok(Some(Addr::Last))
            }
            Some('/') => {
                let s = *i + 1;
                let mut j = s;
                while j < cs.len() && cs[j] != '/' {
                    if cs[j] == '\\' {
                        j += 1;
                    }
                    j += 1;
                }
                if j >= cs.len() {
                    return Err("unterminated address regex".into());
                }
                let p: String = cs[s..j].iter().collect();
                *i = j + 1;
                Ok(Some(Addr::Re(build_regex(&p, false, false)?)))
            }
            _ => Ok(None),
        }
    }
    while i < cs.len() {
        while i < cs.len() && (cs[i].is_whitespace() || cs[i] == ';') {
            i += 1;
        }
        if i >= cs.len() {
            break;
        }
        let a1 = addr(&cs, &mut i)?;
        let mut a2 = None;
        if a1.is_some() && cs.get(i) == Some(&',') {
            i += 1;
            a2 = addr(&cs, &mut i)?;
            if a2.is_none() {
                return Err(bad());
            }
        }
        let cmd = match cs.get(i) {
            Some('p') => {
                i += 1;
                SedCmd::Print
            }
            Some('d') => {
                i += 1;
                SedCmd::Delete
            }
            Some('q') => {
                i += 1;
                SedCmd::Quit
            }
            Some('=') => {
                i += 1;
                SedCmd::LineNo
            }
            Some('s') => {
                let delim = *cs.get(i + 1).ok_or_else(bad)?;
                let mut parts = Vec::new();
                let mut j = i + 2;
                let mut cur = String::new();
                while j < cs.len() && parts.len() < 2 {
                    if cs[j] == '\\' && j + 1 < cs.len() && cs[j + 1] == delim {
                        cur.push(delim);
                        j += 2;
                        continue;
                    }
                    if cs[j] == '\\' && j + 1 < cs.len() {
                        cur.push('\\');
                        cur.push(cs[j + 1]);
                        j += 2;
                        continue;
                    }
                    if cs[j] == delim {
                        parts.push(std::mem::take(&mut cur));
                    } else {
                        cur.push(cs[j]);
                    }
                    j += 1;
                }
                if parts.len() < 2 {
                    return Err(format!("unterminated `s' command in '{script}'"));
                }
                let (mut global, mut print, mut icase) = (false, false, false);
                while j < cs.len() && !matches!(cs[j], ';' | '\n' | '}') && !cs[j].is_whitespace() {
                    match cs[j] {
                        'g' => global = true,
                        'p' => print = true,
                        'i' | 'I' => icase = true,
                        _ => return Err(format!("unknown option to `s' in '{script}'")),
                    }
                    j += 1;
                }
                i = j;
                let re = build_regex(&parts[0], false, icase)?;
                SedCmd::Subst {
                    re,
                    rep: sed_replacement(&parts[1]),
                    global,
                    print,
                }
            }
            _ => return Err(bad()),
        };
        rules.push(SedRule {
            a1,
            a2,
            cmd,
            active: false,
        });
    }
    Ok(rules)
}

/// Turns sed's `&` and `\1` into regex-lite's `${0}` and `${1}`.
fn sed_replacement(r: &str) -> String {
    let mut out = String::new();
    let mut it = r.chars();
    while let Some(c) = it.next() {
        match c {
            '&' => out.push_str("${0}"),
            '$' => out.push_str("$$"),
            '\\' => match it.next() {
                Some(d) if d.is_ascii_digit() => out.push_str(&format!("${{{d}}}")),
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some(o) => out.push(o),
                None => {}
            },
            _ => out.push(c),
        }
    }
    out
}

fn addr_hit(a: &Addr, n: usize, last: bool, line: &str) -> bool {
    match a {
        Addr::Line(k) => *k == n,
        Addr::Last => last,
        Addr::Re(r) => r.is_match(line),
    }
}

fn sed(io: &mut Io, args: &[String]) -> io::Result<i32> {
    let (flags, mut rest) = match getopt(args, "e") {
        Ok(x) => x,
        Err(e) => return io.usage(&e),
    };
    if let Some(r) = unknown_flag(io, &flags, "niEe") {
        return r;
    }
    let scripts: Vec<&str> = flags
        .iter()
        .filter(|(f, _)| *f == 'e')
        .map(|(_, v)| v.as_str())
        .collect();
    let script = if scripts.is_empty() {
        if rest.is_empty() {
            return io.usage("sed [-n] [-i] SCRIPT [FILE...]");
        }
        rest.remove(0)
    } else {
        scripts.join("\n")
    };
    let quiet = has(&flags, 'n');
    let in_place = has(&flags, 'i');
    if in_place && rest.is_empty() {
        return io.usage("sed -i SCRIPT FILE...");
    }
    let mut rules = match sed_parse(&script) {
        Ok(r) => r,
        Err(e) => {
            io.err(e);
            return Ok(1);
        }
    };
    let all = inputs(io, &rest);
    let code = if all.len() < rest.len() { 2 } else { 0 };
    let groups: Vec<Vec<(String, Vec<u8>)>> = if in_place {
        all.into_iter().map(|x| vec![x]).collect()
    } else {
        vec![all]
    };
    for group in groups {
        let text: Vec<String> = group
            .iter()
            .flat_map(|(_, d)| {
                lines(d)
                    .into_iter()
                    .map(|l| String::from_utf8_lossy(l).into_owned())
                    .collect::<Vec<_>>()
            })
            .collect();
        let mut buf: Vec<u8> = Vec::new();
        let total = text.len();
        for r in rules.iter_mut() {
            r.active = false;
        }
        let mut quit = false;
        for (idx, line) in text.into_iter().enumerate() {
            let n = idx + 1;
            let last = n == total;
            let mut line = line;
            let mut deleted = false;
            for r in rules.iter_mut() {
                let hit = match (&r.a1, &r.a2) {
                    (None, _) => true,
                    (Some(a), None) => addr_hit(a, n, last, &line),
                    (Some(a), Some(b)) => {
                        if r.active {
                            let end = match b {
                                Addr::Line(k) => n >= *k,
                                _ => addr_hit(b, n, last, &line),
                            };
                            if end {
                                r.active = false;
                            }
                            true
                        } else if addr_hit(a, n, last, &line) {
                            let end_now = matches!(b, Addr::Line(k) if *k <= n);
                            r.active = !end_now;
                            true
                        } else {
                            false
                        }
                    }
                };
                if !hit {
                    continue;
                }
                match &r.cmd {
                    SedCmd::Print => {
                        buf.extend_from_slice(line.as_bytes());
                        buf.push(b'\n');
                    }
                    SedCmd::Delete => {
                        deleted = true;
                        break;
                    }
                    SedCmd::Quit => {
                        quit = true;
                        break;
                    }
                    SedCmd::LineNo => buf.extend_from_slice(format!("{n}\n").as_bytes()),
                    SedCmd::Subst {
                        re,
                        rep,
                        global,
                        print,
                    } => {
                        if re.is_match(&line) {
                            line = if *global {
                                re.replace_all(&line, rep.as_str())
                            } else {
                                re.replacen(&line, 1, rep.as_str())
                            }
                            .into_owned();
                            if *print {
                                buf.extend_from_slice(line.as_bytes());
                                buf.push(b'\n');
                            }
                        }
                    }
                }
            }
            if !deleted && !quiet {
                buf.extend_from_slice(line.as_bytes());
                buf.push(b'\n');
            }
            if quit {
                break;
            }
        }
        if in_place {
            if let Some((name, _)) = group.first() {
                if let Err(e) = fs::write(name, &buf) {
                    io.err(format!("{name}: {}", errmsg(&e)));
                    return Ok(4);
                }
            }
        } else {
            io.out.write_all(&buf)?;
        }
    }
    Ok(code)
}

fn field_split(line: &str, sep: Option<char>) -> Vec<&str> {
    match sep {
        Some(c) => line.split(c).collect(),
        None => line.split_whitespace().collect(),
    }
}

fn sort(io: &mut Io, args: &[String]) -> io::Result<i32> {
    let (flags, files) = match getopt(args, "kt") {
        Ok(x) => x,
        Err(e) => return io.usage(&e),
    };
    if let Some(r) = unknown_flag(io, &flags, "nrukt") {
        return r;
    }
    let sep = value(&flags, 't').and_then(|s| s.chars().next());
    let key = match value(&flags, 'k') {
        None => None,
        Some(k) => {
            let mut it = k.split(',');
            let a = it.next().and_then(|s| {
                s.trim_end_matches(|c: char| c.is_alphabetic())
                    .parse::<usize>()
                    .ok()
            });
            let b = it.next().and_then(|s| {
                s.trim_end_matches(|c: char| c.is_alphabetic())
                    .parse::<usize>()
                    .ok()
            });
            match a {
                Some(a) if a >= 1 => Some((a, b)),
                _ => {
                    io.err(format!("invalid key '{k}'"));
                    return Ok(2);
                }
            }
        }
    };
    let all = inputs(io, &files);
    let code = if all.len() < files.len() { 2 } else { 0 };
    let mut ls: Vec<String> = all
        .iter()
        .flat_map(|(_, d)| {
            lines(d)
                .into_iter()
                .map(|l| String::from_utf8_lossy(l).into_owned())
        })
        .collect();
    let keyof = |l: &str| -> String {
        match key {
            None => l.to_string(),
            Some((a, b)) => {
                let f = field_split(l, sep);
                let end = b.unwrap_or(f.len()).min(f.len());
                if a > f.len() || a > end {
                    String::new()
                } else {
                    f[a - 1..end].join(&sep.map(|c| c.to_string()).unwrap_or_else(|| " ".into()))
                }
            }
        }
    };
    let numeric = has(&flags, 'n');
    let num = |s: &str| -> f64 {
        let t = s.trim_start();
        let end = t
            .char_indices()
            .take_while(|(i, c)| {
                c.is_ascii_digit() || *c == '.' || (*i == 0 && (*c == '-' || *c == '+'))
            })
            .map(|(i, c)| i + c.len_utf8())
            .last()
            .unwrap_or(0);
        t[..end].parse().unwrap_or(0.0)
    };
    let cmp = |x: &String, y: &String| -> std::cmp::Ordering {
        let (kx, ky) = (keyof(x), keyof(y));
        if numeric {
            num(&kx)
                .partial_cmp(&num(&ky))
                .unwrap_or(std::cmp::Ordering::Equal)
        } else {
            kx.cmp(&ky)
        }
    };
    ls.sort_by(|a, b| {
        let o = cmp(a, b);
        if has(&flags, 'r') {
            o.reverse()
        } else {
            o
        }
    });
    if has(&flags, 'u') {
        ls.dedup_by(|a, b| cmp(a, b) == std::cmp::Ordering::Equal);
    }
    for l in ls {
        writeln!(io.out, "{l}")?;
    }
    Ok(code)
}

fn uniq(io: &mut Io, args: &[String]) -> io::Result<i32> {
    let (flags, files) = match getopt(args, "") {
        Ok(x) => x,
        Err(e) => return io.usage(&e),
    };
    if let Some(r) = unknown_flag(io, &flags, "cdu") {
        return r;
    }
    let all = inputs(io, &files[..files.len().min(1)]);
    let Some((_, data)) = all.first() else {
        return Ok(1);
    };
    let mut groups: Vec<(&[u8], usize)> = Vec::new();
    for l in lines(data) {
        match groups.last_mut() {
            Some((p, n)) if *p == l => *n += 1,
            _ => groups.push((l, 1)),
        }
    }
    for (l, n) in groups {
        if (has(&flags, 'd') && n < 2) || (has(&flags, 'u') && n > 1) {
            continue;
        }
        if has(&flags, 'c') {
            write!(io.out, "{n:7} ")?;
        }
        write_line(io.out, l)?;
    }
    Ok(0)
}

fn parse_list(s: &str) -> Option<Vec<(usize, usize)>> {
    let mut v = Vec::new();
    for part in s.split(',') {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (
                if a.is_empty() { 1 } else { a.parse().ok()? },
                if b.is_empty() {
                    usize::MAX
                } else {
                    b.parse().ok()?
                },
            ),
            None => {
                let n = part.parse().ok()?;
                (n, n)
            }
        };
        if a == 0 || b < a {
            return None;
        }
        v.push((a, b));
    }
    Some(v)
}

fn cut(io: &mut Io, args: &[String]) -> io::Result<i32> {
    let (flags, files) = match getopt(args, "dfc") {
        Ok(x) => x,
        Err(e) => return io.usage(&e),
    };
    if let Some(r) = unknown_flag(io, &flags, "dfcs") {
        return r;
    }
    let delim = value(&flags, 'd')
        .map(|d| d.chars().next().unwrap_or('\t'))
        .unwrap_or('\t');
    let (list, chars) = match (value(&flags, 'f'), value(&flags, 'c')) {
        (Some(f), None) => (parse_list(f), false),
        (None, Some(c)) => (parse_list(c), true),
        _ => return io.usage("cut -d DELIM -f LIST [FILE...] | cut -c LIST [FILE...]"),
    };
    let Some(list) = list else {
        io.err("invalid field list");
        return Ok(2);
    };
    let sel = |i: usize| list.iter().any(|(a, b)| *a <= i && i <= *b);
    let all = inputs(io, &files);
    for (_, data) in &all {
        for l in lines(data) {
            let l = String::from_utf8_lossy(l);
            if chars {
                let s: String = l
                    .chars()
                    .enumerate()
                    .filter(|(i, _)| sel(i + 1))
                    .map(|(_, c)| c)
                    .collect();
                writeln!(io.out, "{s}")?;
            } else if !l.contains(delim) {
                if !has(&flags, 's') {
                    writeln!(io.out, "{l}")?;
                }
            } else {
                let f: Vec<&str> = l
                    .split(delim)
                    .enumerate()
                    .filter(|(i, _)| sel(i + 1))
                    .map(|(_, s)| s)
                    .collect();
                writeln!(io.out, "{}", f.join(&delim.to_string()))?;
            }
        }
    }
    Ok(if all.len() < files.len() { 1 } else { 0 })
}

fn tr_set(s: &str) -> Vec<char> {
    let mut raw: Vec<char> = Vec::new();
    let mut rest = s;
    while !rest.is_empty() {
        let class = [
            ("[:lower:]", "abcdefghijklmnopqrstuvwxyz"),
            ("[:upper:]", "ABCDEFGHIJKLMNOPQRSTUVWXYZ"),
            ("[:digit:]", "0123456789"),
            ("[:space:]", " \t\n\r\x0b\x0c"),
            ("[:punct:]", "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"),
        ]
        .iter()
        .find(|(k, _)| rest.starts_with(k));
        if let Some((k, v)) = class {
            raw.extend(v.chars());
            rest = &rest[k.len()..];
            continue;
        }
        let mut it = rest.chars();
        let c = it.next().unwrap_or(' ');
        let c = if c == '\\' {
            let n = it.next().unwrap_or('\\');
            match n {
                'n' => '\n',
                't' => '\t',
                'r' => '\r',
                o => o,
            }
        } else {
            c
        };
        rest = it.as_str();
        raw.push(c);
    }
    let mut out = Vec::new();
    let mut i = 0;
    while i < raw.len() {
        if i + 2 < raw.len() && raw[i + 1] == '-' && raw[i] <= raw[i + 2] {
            out.extend(raw[i]..=raw[i + 2]);
            i += 3;
        } else {
            out.push(raw[i]);
            i += 1;
        }
    }
    out
}

fn tr(io: &mut Io, args: &[String]) -> io::Result<i32> {
    let (flags, sets) = match getopt(args, "") {
        Ok(x) => x,
        Err(e) => return io.usage(&e),
    };
    if let Some(r) = unknown_flag(io, &flags, "ds") {
        return r;
    }
    let text = String::from_utf8_lossy(io.input).into_owned();
    let mut out = String::with_capacity(text.len());
    if has(&flags, 'd') {
        let Some(s1) = sets.first() else {
            return io.usage("tr -d SET");
        };
        let del = tr_set(s1);
        out.extend(text.chars().filter(|c| !del.contains(c)));
    } else if has(&flags, 's') && sets.len() == 1 {
        out = text;
    } else {
        if sets.len() != 2 {
            return io.usage("tr SET1 SET2 | tr -d SET | tr -s SET");
        }
        let (a, b) = (tr_set(&sets[0]), tr_set(&sets[1]));
        if b.is_empty() {
            return io.usage("tr SET1 SET2: SET2 must not be empty");
        }
        for c in text.chars() {
            match a.iter().rposition(|x| *x == c) {
                Some(i) => out.push(b[i.min(b.len() - 1)]),
                None => out.push(c),
            }
        }
    }
    if has(&flags, 's') {
        let squeeze = tr_set(sets.last().map(String::as_str).unwrap_or(""));
        let mut s = String::with_capacity(out.len());
        let mut prev: Option<char> = None;
        for c in out.chars() {
            if prev == Some(c) && squeeze.contains(&c) {
                continue;
            }
            prev = Some(c);
            s.push(c);
        }
        out = s;
    }
    io.out.write_all(out.as_bytes())?;
    Ok(0)
}

fn unescape_str(s: &str) -> String {
    let mut out = String::new();
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some('\\') => out.push('\\'),
            Some('0') => out.push('\0'),
            Some(o) => {
                out.push('\\');
                out.push(o);
            }
            None => out.push('\\'),
        }
    }
    out
}

fn echo(io: &mut Io, args: &[String]) -> io::Result<i32> {
    let mut newline = true;
    let mut escapes = false;
    let mut i = 0;
    while i < args.len() && matches!(args[i].as_str(), "-n" | "-e" | "-ne" | "-en") {
        newline &= !args[i].contains('n');
        escapes |= args[i].contains('e');
        i += 1;
    }
    let s = args[i..].join(" ");
    let s = if escapes { unescape_str(&s) } else { s };
    io.out.write_all(s.as_bytes())?;
    if newline {
        io.out.write_all(b"\n")?;
    }
    Ok(0)
}

fn printf(io: &mut Io, args: &[String]) -> io::Result<i32> {
    let Some(fmt) = args.first() else {
        return io.usage("printf FORMAT [ARG...]");
    };
    let fmt: Vec<char> = unescape_str(fmt).chars().collect();
    let mut vals = args[1..].iter();
    let mut out = String::new();
    let mut code = 0;
    loop {
        let mut used = false;
        let mut i = 0;
        while i < fmt.len() {
            if fmt[i] != '%' {
                out.push(fmt[i]);
                i += 1;
                continue;
            }
            i += 1;
            let start = i;
            while i < fmt.len() && "-+ 0#.0123456789".contains(fmt[i]) {
                i += 1;
            }
            let spec: String = fmt[start..i].iter().collect();
            let Some(&conv) = fmt.get(i) else { break };
            i += 1;
            if conv == '%' {
                out.push('%');
                continue;
            }
            used = true;
            let arg = vals.next().map(String::as_str).unwrap_or("");
            let left = spec.starts_with('-');
            let zero = spec.starts_with('0');
            let (w, p) = match spec
                .trim_start_matches(['-', '+', ' ', '0', '#'])
                .split_once('.')
            {
                Some((w, p)) => (w.parse::<usize>().unwrap_or(0), p.parse::<usize>().ok()),
                None => (
                    spec.trim_start_matches(['-', '+', ' ', '0', '#'])
                        .parse::<usize>()
                        .unwrap_or(0),
                    None,
                ),
            };
            let body = match conv {
                's' => match p {
                    Some(p) => arg.chars().take(p).collect(),
                    None => arg.to_string(),
                },
                'd' | 'i' => match arg.trim().parse::<i64>() {
                    Ok(n) => n.to_string(),
                    Err(_) if arg.is_empty() => "0".into(),
                    Err(_) => {
                        code = 1;
                        "0".into()
                    }
                },
                'x' => format!("{:x}", arg.trim().parse::<i64>().unwrap_or(0)),
                'c' => arg.chars().next().map(String::from).unwrap_or_default(),
                'f' | 'g' | 'e' => {
                    let v = arg.trim().parse::<f64>().unwrap_or(0.0);
                    format!("{:.*}", p.unwrap_or(6), v)
                }
                _ => {
                    io.err(format!("%{conv}: invalid directive"));
                    return Ok(1);
                }
            };
            let pad = w.saturating_sub(body.chars().count());
            if left {
                out.push_str(&body);
                out.extend(std::iter::repeat_n(' ', pad));
            } else {
                out.extend(std::iter::repeat_n(
                    if zero && conv != 's' { '0' } else { ' ' },
                    pad,
                ));
                out.push_str(&body);
            }
        }
        if !used || vals.len() == 0 {
            break;
        }
    }
    io.out.write_all(out.as_bytes())?;
    Ok(code)
}

fn seq(io: &mut Io, args: &[String]) -> io::Result<i32> {
    let nums: Option<Vec<i64>> = args.iter().map(|a| parse_num(a)).collect();
    let (first, step, last) = match nums.as_deref() {
        Some([l]) => (1, 1, *l),
        Some([f, l]) => (*f, 1, *l),
        Some([f, s, l]) if *s != 0 => (*f, *s, *l),
        _ => return io.usage("seq [FIRST [INCREMENT]] LAST (integers)"),
    };
    let mut i = first;
    let mut buf = String::new();
    while (step > 0 && i <= last) || (step < 0 && i >= last) {
        buf.push_str(&i.to_string());
        buf.push('\n');
        if buf.len() > 1 << 16 {
            io.out.write_all(buf.as_bytes())?;
            buf.clear();
        }
        match i.checked_add(step) {
            Some(n) => i = n,
            None => break,
        }
    }
    io.out.write_all(buf.as_bytes())?;
    Ok(0)
}

// ------------------------------------------------------------------ arithmetic

/// `expr`: integer arithmetic and comparisons over separate arguments.
fn expr(io: &mut Io, args: &[String]) -> io::Result<i32> {
    fn prec(op: &str) -> Option<u8> {
        Some(match op {
            "|" => 1,
            "&" => 2,
            "=" | "!=" | "<" | ">" | "<=" | ">=" => 3,
            "+" | "-" => 4,
            "*" | "/" | "%" => 5,
            _ => return None,
        })
    }
    fn apply(op: &str, a: &str, b: &str) -> Result<String, &'static str> {
        let (x, y) = (a.parse::<i64>().ok(), b.parse::<i64>().ok());
        let num = |f: fn(i64, i64) -> Option<i64>| match (x, y) {
            (Some(x), Some(y)) => f(x, y).map(|v| v.to_string()).ok_or("arithmetic error"),
            _ => Err("non-integer argument"),
        };
        let truthy = |s: &str| !(s.is_empty() || s == "0");
        let cmp = |o: std::cmp::Ordering| -> String {
            let r = match op {
                "=" => o.is_eq(),
                "!=" => !o.is_eq(),
                "<" => o.is_lt(),
                ">" => o.is_gt(),
                "<=" => o.is_le(),
                _ => o.is_ge(),
            };
            if r { "1" } else { "0" }.to_string()
        };
        match op {
            "+" => num(i64::checked_add),
            "-" => num(i64::checked_sub),
            "*" => num(i64::checked_mul),
            "/" => num(i64::checked_div).map_err(|e| {
                if e == "arithmetic error" {
                    "division by zero"
                } else {
                    e
                }
            }),
            "%" => num(i64::checked_rem).map_err(|e| {
                if e == "arithmetic error" {
                    "division by zero"
                } else {
                    e
                }
            }),
            "|" => Ok(if truthy(a) {
                a.to_string()
            } else if truthy(b) {
                b.to_string()
            } else {
                "0".into()
            }),
            "&" => Ok(if truthy(a) && truthy(b) {
                a.to_string()
            } else {
                "0".into()
            }),
            _ => Ok(match (x, y) {
                (Some(x), Some(y)) => cmp(x.cmp(&y)),
                _ => cmp(a.cmp(b)),
            }),
        }
    }
    // Shunting-yard over the argument list.
    let mut vals: Vec<String> = Vec::new();
    let mut ops: Vec<String> = Vec::new();
    let reduce = |vals: &mut Vec<String>, ops: &mut Vec<String>| -> Result<(), &'static str> {
        let op = ops.pop().ok_or("syntax error")?;
        let b = vals.pop().ok_or("syntax error")?;
        let a = vals.pop().ok_or("syntax error")?;
        vals.push(apply(&op, &a, &b)?);
        Ok(())
    };
    let mut expect_val = true;
    let mut result: Result<(), &'static str> = Ok(());
    for a in args {
        if a == "(" {
            ops.push(a.clone());
            continue;
        }
        if a == ")" {
            while ops.last().is_some_and(|o| o != "(") {
                if let Err(e) = reduce(&mut vals, &mut ops) {
                    result = Err(e);
                }
            }
            if ops.pop().is_none() {
                result = Err("syntax error");
            }
            continue;
        }
        match (expect_val, prec(a)) {
            (false, Some(p)) => {
                while ops.last().and_then(|o| prec(o)).is_some_and(|q| q >= p) {
                    if let Err(e) = reduce(&mut vals, &mut ops) {
                        result = Err(e);
                        break;
                    }
                }
                ops.push(a.clone());
                expect_val = true;
            }
            (true, _) => {
                vals.push(a.clone());
                expect_val = false;
            }
            (false, None) => result = Err("syntax error"),
        }
        if result.is_err() {
            break;
        }
    }
    while result.is_ok() && !ops.is_empty() {
        result = reduce(&mut vals, &mut ops);
    }
    match (result, vals.as_slice()) {
        (Ok(()), [v]) => {
            writeln!(io.out, "{v}")?;
            Ok(if v.is_empty() || v == "0" { 1 } else { 0 })
        }
        (Err(e), _) => {
            io.err(e);
            Ok(2)
        }
        _ => {
            io.err("syntax error");
            Ok(2)
        }
    }
}

/// `calc`: a calculator over one expression: `+ - * / % ^`, parentheses,
/// unary minus, decimals, and `sqrt abs floor ceil round min max`.
fn calc_cmd(io: &mut Io, args: &[String]) -> io::Result<i32> {
    let src = args.join(" ");
    if src.trim().is_empty() {
        return io.usage("calc EXPRESSION   e.g. calc '(2 + 3) * 4 / 3'");
    }
    match calc::eval(&src) {
        Ok(v) => {
            writeln!(io.out, "{}", calc::fmt(v))?;
            Ok(0)
        }
        Err(e) => {
            io.err(e);
            Ok(2)
        }
    }
}

mod calc {
    pub fn fmt(v: f64) -> String {
        if v.fract() == 0.0 && v.abs() < 1e15 {
            format!("{}", v as i64)
        } else {
            let s = format!("{v:.10}");
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        }
    }

    pub fn eval(s: &str) -> Result<f64, String> {
        let toks: Vec<char> = s.chars().filter(|c| !c.is_whitespace()).collect();
        let mut p = P {
            t: toks,
            i: 0,
            depth: 0,
        };
        let v = p.sum()?;
        if p.i != p.t.len() {
            return Err(format!("unexpected '{}'", p.t[p.i]));
        }
        if !v.is_finite() {
            return Err("result is not a finite number (division by zero?)".into());
        }
        Ok(v)
    }

    struct P {
        t: Vec<char>,
        i: usize,
        depth: usize,
    }

    impl P {
        fn peek(&self) -> Option<char> {
            self.t.get(self.i).copied()
        }
        fn sum(&mut self) -> Result<f64, String> {
            let mut v = self.product()?;
            while let Some(c @ ('+' | '-')) = self.peek() {
                self.i += 1;
                let r = self.product()?;
                v = if c == '+' { v + r } else { v - r };
            }
            Ok(v)
        }
        fn product(&mut self) -> Result<f64, String> {
            let mut v = self.power()?;
            while let Some(c @ ('*' | '/' | '%')) = self.peek() {
                self.i += 1;
                let r = self.power()?;
                v = match c {
                    '*' => v * r,
                    '/' => v / r,
                    _ => v % r,
                };
            }
            Ok(v)
        }
        fn power(&mut self) -> Result<f64, String> {
            let b = self.unary()?;
            if self.peek() == Some('^') {
                self.i += 1;
                let e = self.power()?;
                return Ok(b.powf(e));
            }
            Ok(b)
        }
        fn unary(&mut self) -> Result<f64, String> {
            match self.peek() {
                Some('-') => {
                    self.i += 1;
                    Ok(-self.unary()?)
                }
                Some('+') => {
                    self.i += 1;
                    self.unary()
                }
                _ => self.atom(),
            }
        }
        fn atom(&mut self) -> Result<f64, String> {
            self.depth += 1;
            if self.depth > 200 {
                return Err("expression nested too deeply".into());
            }
            let r = self.atom_inner();
            self.depth -= 1;
            r
        }
        fn atom_inner(&mut self) -> Result<f64, String> {
            match self.peek() {
                Some('(') => {
                    self.i += 1;
                    let v = self.sum()?;
                    if self.peek() != Some(')') {
                        return Err("missing ')'".into());
                    }
                    self.i += 1;
                    Ok(v)
                }
                Some(c) if c.is_ascii_digit() || c == '.' => {
                    let s = self.i;
                    while self
                        .peek()
                        .is_some_and(|c| c.is_ascii_digit() || c == '.' || c == 'e')
                    {
                        self.i += 1;
                    }
                    let text: String = self.t[s..self.i].iter().collect();
                    text.parse().map_err(|_| format!("bad number '{text}'"))
                }
                Some(c) if c.is_ascii_alphabetic() => {
                    let s = self.i;
                    while self.peek().is_some_and(|c| c.is_ascii_alphabetic()) {
                        self.i += 1;
                    }
                    let name: String = self.t[s..self.i].iter().collect();
                    if name == "pi" {
                        return Ok(std::f64::consts::PI);
                    }
                    if self.peek() != Some('(') {
                        return Err(format!("unknown name '{name}'"));
                    }
                    self.i += 1;
                    let mut argv = vec![self.sum()?];
                    while self.peek() == Some(',') {
                        self.i += 1;
                        argv.push(self.sum()?);
                    }
                    if self.peek() != Some(')') {
                        return Err("missing ')'".into());
                    }
                    self.i += 1;
                    match (name.as_str(), argv.as_slice()) {
                        ("sqrt", [x]) => Ok(x.sqrt()),
                        ("abs", [x]) => Ok(x.abs()),
                        ("floor", [x]) => Ok(x.floor()),
                        ("ceil", [x]) => Ok(x.ceil()),
                        ("round", [x]) => Ok(x.round()),
                        ("min", [x, y]) => Ok(x.min(*y)),
                        ("max", [x, y]) => Ok(x.max(*y)),
                        _ => Err(format!(
                            "unknown function '{name}' or wrong number of arguments"
                        )),
                    }
                }
                Some(c) => Err(format!("unexpected '{c}'")),
                None => Err("unexpected end of expression".into()),
            }
        }
    }
}
