//! `grep`: line matching over files, stdin or a walked tree, with a
//! substring fast path for plain literals.

use std::fs;
use std::io;

use super::{
    bre_to_ere, build_regex, getopt, has, inputs, lines, unknown_flag, value, write_line, Io,
};
use corvid_shell_syntax::grep_prefix;

use crate::dir;

/// `pattern` itself when it is a non-empty literal: taken as is by `-F`,
/// or free of every BRE and ERE metacharacter (so the regex built from it
/// matches exactly the lines that contain it).
fn plain_literal(pattern: &str, fixed: bool) -> Option<&str> {
    let plain = fixed || !pattern.chars().any(|c| "\\.[]*^$+?(){}|".contains(c));
    (plain && !pattern.is_empty()).then_some(pattern)
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

pub(super) fn grep(io: &mut Io, args: &[String]) -> io::Result<i32> {
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
            let prefix = grep_prefix(name, i + 1, multi, number);
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
