//! The file and path commands: cat, head/tail, wc, ls, mkdir, rm, cp/mv,
//! touch, find, pwd, cd, basename, dirname and diff.

use std::fs;
use std::io::{self, Write};
use std::path::Path;

use super::{errmsg, getopt, has, inputs, lines, unknown_flag, value, write_line, Io};
use crate::dir;
use crate::glob;

pub(super) fn cat(io: &mut Io, args: &[String]) -> io::Result<i32> {
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

pub(super) fn head_tail(io: &mut Io, args: &[String], head: bool) -> io::Result<i32> {
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

pub(super) fn wc(io: &mut Io, args: &[String]) -> io::Result<i32> {
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

pub(super) fn ls(io: &mut Io, args: &[String]) -> io::Result<i32> {
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

pub(super) fn mkdir(io: &mut Io, args: &[String]) -> io::Result<i32> {
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

pub(super) fn rm(io: &mut Io, args: &[String]) -> io::Result<i32> {
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

pub(super) fn cp(io: &mut Io, args: &[String]) -> io::Result<i32> {
    cp_mv(io, args, false)
}

pub(super) fn mv(io: &mut Io, args: &[String]) -> io::Result<i32> {
    cp_mv(io, args, true)
}

pub(super) fn touch(io: &mut Io, args: &[String]) -> io::Result<i32> {
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

pub(super) fn find(io: &mut Io, args: &[String]) -> io::Result<i32> {
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

pub(super) fn pwd(io: &mut Io) -> io::Result<i32> {
    let d = std::env::current_dir()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "/workspace".into());
    writeln!(io.out, "{d}")?;
    Ok(0)
}

pub(super) fn cd(io: &mut Io, args: &[String]) -> io::Result<i32> {
    let target = args.first().map(String::as_str).unwrap_or("/workspace");
    match std::env::set_current_dir(target) {
        Ok(()) => Ok(0),
        Err(e) => {
            io.err(format!("{target}: {}", errmsg(&e)));
            Ok(1)
        }
    }
}

pub(super) fn basename(io: &mut Io, args: &[String]) -> io::Result<i32> {
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

pub(super) fn dirname(io: &mut Io, args: &[String]) -> io::Result<i32> {
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

pub(super) fn diff(io: &mut Io, args: &[String]) -> io::Result<i32> {
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
