//! Shell-style wildcard matching (`*`, `?`, `[a-z]`, `[!x]`, `\` escapes) and
//! filesystem expansion of words that contain unquoted wildcards.

use std::fs;

/// Whether `name` matches the wildcard `pat` (whole string).
pub fn matches(pat: &str, name: &str) -> bool {
    let p: Vec<char> = pat.chars().collect();
    let n: Vec<char> = name.chars().collect();
    match_from(&p, &n)
}

fn match_from(p: &[char], n: &[char]) -> bool {
    // Iterative matcher with single-star backtracking: linear in practice,
    // never exponential on patterns such as `*a*a*a*a*b`.
    let (mut pi, mut ni) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() {
            match p[pi] {
                '*' => {
                    star = Some((pi, ni));
                    pi += 1;
                    continue;
                }
                '?' => {
                    pi += 1;
                    ni += 1;
                    continue;
                }
                '[' => {
                    if let Some((ok, len)) = class(&p[pi..], n[ni]) {
                        if ok {
                            pi += len;
                            ni += 1;
                            continue;
                        }
                    } else if n[ni] == '[' {
                        pi += 1;
                        ni += 1;
                        continue;
                    }
                }
                '\\' if pi + 1 < p.len() => {
                    if p[pi + 1] == n[ni] {
                        pi += 2;
                        ni += 1;
                        continue;
                    }
                }
                c => {
                    if c == n[ni] {
                        pi += 1;
                        ni += 1;
                        continue;
                    }
                }
            }
        }
        match star {
            Some((sp, sn)) => {
                pi = sp + 1;
                ni = sn + 1;
                star = Some((sp, sn + 1));
            }
            None => return false,
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

/// Matches a bracket class at the start of `p`; returns (matched, pattern length).
fn class(p: &[char], c: char) -> Option<(bool, usize)> {
    let mut i = 1;
    let negate = i < p.len() && (p[i] == '!' || p[i] == '^');
    if negate {
        i += 1;
    }
    let mut found = false;
    let mut first = true;
    while i < p.len() {
        if p[i] == ']' && !first {
            return Some((found != negate, i + 1));
        }
        first = false;
        if i + 2 < p.len() && p[i + 1] == '-' && p[i + 2] != ']' {
            if p[i] <= c && c <= p[i + 2] {
                found = true;
            }
            i += 3;
        } else {
            if p[i] == c {
                found = true;
            }
            i += 1;
        }
    }
    None
}

/// Whether a pattern contains a wildcard that is not escaped.
pub fn has_meta(pat: &str) -> bool {
    let mut esc = false;
    for c in pat.chars() {
        if esc {
            esc = false;
        } else if c == '\\' {
            esc = true;
        } else if matches!(c, '*' | '?' | '[') {
            return true;
        }
    }
    false
}

/// Removes the `\` escapes of a pattern.
pub fn unescape(pat: &str) -> String {
    let mut out = String::new();
    let mut esc = false;
    for c in pat.chars() {
        if !esc && c == '\\' {
            esc = true;
            continue;
        }
        esc = false;
        out.push(c);
    }
    out
}

/// Expands a pattern against the filesystem; sorted, empty if nothing matches.
pub fn expand(pat: &str) -> Vec<String> {
    let absolute = pat.starts_with('/');
    let comps: Vec<&str> = pat.split('/').filter(|c| !c.is_empty()).collect();
    let mut bases: Vec<String> = vec![if absolute { "/".into() } else { String::new() }];
    for (i, comp) in comps.iter().enumerate() {
        let last = i + 1 == comps.len();
        let mut next = Vec::new();
        for base in &bases {
            if has_meta(comp) {
                let dir = if base.is_empty() { "." } else { base.as_str() };
                let Ok(names) = crate::dir::names(dir) else {
                    continue;
                };
                let names = names
                    .into_iter()
                    .filter(|n| !n.starts_with('.') || comp.starts_with('.'))
                    .filter(|n| matches(comp, n));
                for n in names {
                    let p = join(base, &n);
                    if last || fs::metadata(&p).map(|m| m.is_dir()).unwrap_or(false) {
                        next.push(p);
                    }
                }
            } else {
                next.push(join(base, &unescape(comp)));
            }
        }
        bases = next;
        if bases.is_empty() {
            break;
        }
    }
    let mut out: Vec<String> = bases
        .into_iter()
        .filter(|p| fs::symlink_metadata(p).is_ok())
        .collect();
    out.sort();
    out
}

fn join(base: &str, name: &str) -> String {
    if base.is_empty() {
        name.to_string()
    } else if base.ends_with('/') {
        format!("{base}{name}")
    } else {
        format!("{base}/{name}")
    }
}
