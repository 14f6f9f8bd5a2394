//! Pure text rules of the toolbox's commands that the host-side simulator
//! (`corvid-tasks`' `sim::shell`) must follow to the byte: one definition, compiled into both.

/// Translates a POSIX basic regular expression (`grep`, `sed` without `-E`) to the extended
/// syntax: `\(`, `\)`, `\|`, `\{`, `\}`, `\+`, `\?` become operators and the bare characters
/// become literals.
pub fn bre_to_ere(p: &str) -> String {
    let mut out = String::new();
    let mut it = p.chars();
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

/// `sort -n`'s key of a line: the number its (left-trimmed) text starts with (digits and
/// dots, with a leading sign), 0 where it starts with none.
pub fn leading_number(s: &str) -> f64 {
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
}

/// What `grep` writes before a matching line: the file name when several files are searched
/// (`multi`), the 1-based line number with `-n`.
pub fn grep_prefix(name: &str, line_no: usize, multi: bool, number: bool) -> String {
    match (multi, number) {
        (true, true) => format!("{name}:{line_no}:"),
        (true, false) => format!("{name}:"),
        (false, true) => format!("{line_no}:"),
        (false, false) => String::new(),
    }
}
