//! `sed`: a stream editor over a subset of POSIX sed (addresses `N`, `$`,
//! `/re/` and ranges; commands `s p d q =`), with its script parser and its
//! line runner.

use std::fs;
use std::io;

use regex_lite::Regex;

use super::{build_regex, errmsg, getopt, has, inputs, lines, unknown_flag, Io};

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

pub(super) fn sed(io: &mut Io, args: &[String]) -> io::Result<i32> {
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
