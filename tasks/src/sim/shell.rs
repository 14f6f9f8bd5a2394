//! The simulator's `shell`: the subset of the sandbox toolbox the built-in oracles use,
//! with the toolbox's output text and exit statuses.
//!
//! A command line is one pipeline: words separated by `|`, single-quoted words, and an
//! optional `> FILE` on the last stage. Commands:
//! - `cat FILE...` (exit 1 on a missing file), `ls [DIR]` (exit 2 on a missing one),
//!   `wc -l FILE`, `head -n N [FILE]`;
//! - `grep [-c] [-l] [-n] [-r] [-v] [-E] PATTERN [FILE...]` (POSIX basic regex, or
//!   extended with `-E`; exit 1 on no match, 2 on a missing file);
//! - `sort [-n] [-r]`, `uniq -c`, `cut -d C -f LIST` (on stdin or one file);
//! - `sed -i 'SCRIPT' FILE` with `s/RE/REPLACEMENT/` commands separated by `;`.
//!
//! The shown text is stdout, then stderr, then `[exit code N]` on a non-zero exit, or
//! `(no output)` for an empty successful run — as the sandbox renders a run.

use std::collections::BTreeMap;

use corvid_proto::ToolStatus;
use corvid_shell_syntax::{bre_to_ere, grep_prefix, leading_number};

/// Result of one simulated command: stdout, stderr, exit status.
struct Run {
    out: String,
    err: String,
    code: i32,
}

impl Run {
    fn ok(out: String) -> Self {
        Self {
            out,
            err: String::new(),
            code: 0,
        }
    }
    fn fail(err: String, code: i32) -> Self {
        Self {
            out: String::new(),
            err,
            code,
        }
    }
}

/// Splits `line` into pipeline stages of words (single quotes group, `|` and `>` split).
fn lex(line: &str) -> Result<Vec<Vec<String>>, String> {
    let mut stages = Vec::new();
    let mut stage: Vec<String> = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if matches!(c, ' ' | '\t' | '|' | '>') && in_word {
            stage.push(std::mem::take(&mut word));
            in_word = false;
        }
        match c {
            ' ' | '\t' => {}
            '|' => stages.push(std::mem::take(&mut stage)),
            '>' => stage.push(">".to_string()),
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(q) => word.push(q),
                        None => return Err("unterminated single quote".into()),
                    }
                }
            }
            _ => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        stage.push(word);
    }
    stages.push(stage);
    Ok(stages)
}

/// Splits `-abc` flag clusters; flags in `with_value` take the next word as value.
fn flags(args: &[String], with_value: &str) -> (Vec<(char, String)>, Vec<String>) {
    let mut fl = Vec::new();
    let mut rest = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if a.len() < 2 || !a.starts_with('-') {
            rest.push(a.clone());
            i += 1;
            continue;
        }
        let cs: Vec<char> = a[1..].chars().collect();
        for (j, c) in cs.iter().enumerate() {
            if with_value.contains(*c) {
                let v: String = cs[j + 1..].iter().collect();
                if v.is_empty() {
                    i += 1;
                    fl.push((*c, args.get(i).cloned().unwrap_or_default()));
                } else {
                    fl.push((*c, v));
                }
                break;
            }
            fl.push((*c, String::new()));
        }
        i += 1;
    }
    (fl, rest)
}

fn has(fl: &[(char, String)], c: char) -> bool {
    fl.iter().any(|(f, _)| *f == c)
}

fn value(fl: &[(char, String)], c: char) -> Option<&str> {
    fl.iter()
        .rev()
        .find(|(f, _)| *f == c)
        .map(|(_, v)| v.as_str())
}

/// The lines of `text`, without the final newline's empty line.
fn lines(text: &str) -> Vec<&str> {
    if text.is_empty() {
        return Vec::new();
    }
    text.strip_suffix('\n')
        .unwrap_or(text)
        .split('\n')
        .collect()
}

fn join_lines<S: AsRef<str>>(ls: &[S]) -> String {
    ls.iter().map(|l| format!("{}\n", l.as_ref())).collect()
}

/// The simulated toolbox over an in-memory workspace.
pub(super) struct Toolbox<'f> {
    pub(super) files: &'f mut BTreeMap<String, Vec<u8>>,
}

impl Toolbox<'_> {
    fn read(&self, f: &str) -> Option<String> {
        self.files
            .get(f)
            .map(|b| String::from_utf8_lossy(b).into_owned())
    }

    /// Files directly under `dir` (names only) and subdirectories, sorted; `None` when
    /// nothing lives there.
    fn entries(&self, dir: &str) -> Option<Vec<String>> {
        let prefix = match dir.trim_matches('/') {
            "" | "." => String::new(),
            d => format!("{d}/"),
        };
        let mut names: Vec<String> = self
            .files
            .keys()
            .filter_map(|p| p.strip_prefix(&prefix))
            .map(|rest| rest.split('/').next().unwrap_or(rest).to_string())
            .collect();
        names.dedup();
        (!names.is_empty() || prefix.is_empty()).then_some(names)
    }

    /// Every file at or below `root`, in the toolbox's walk order (sorted names).
    fn walk(&self, root: &str) -> Option<Vec<String>> {
        if self.files.contains_key(root) {
            return Some(vec![root.to_string()]);
        }
        let prefix = format!("{}/", root.trim_end_matches('/'));
        let v: Vec<String> = self
            .files
            .keys()
            .filter(|p| p.starts_with(&prefix))
            .cloned()
            .collect();
        (!v.is_empty()).then_some(v)
    }

    /// Runs `line` and renders it as the sandbox does.
    pub(super) fn run_line(&mut self, line: &str) -> (ToolStatus, String) {
        let r = match lex(line) {
            Ok(stages) => self.pipeline(stages),
            Err(e) => Run::fail(format!("sh: {e}\n"), 2),
        };
        let mut text = r.out;
        if !r.err.is_empty() {
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&r.err);
        }
        match r.code {
            0 if text.is_empty() => (ToolStatus::Ok, "(no output)".into()),
            0 => (ToolStatus::Ok, text),
            c => {
                if !text.is_empty() && !text.ends_with('\n') {
                    text.push('\n');
                }
                (ToolStatus::ExitNonzero, format!("{text}[exit code {c}]"))
            }
        }
    }

    fn pipeline(&mut self, stages: Vec<Vec<String>>) -> Run {
        let mut input = String::new();
        let mut err = String::new();
        let mut last = Run::ok(String::new());
        let n = stages.len();
        for (i, mut argv) in stages.into_iter().enumerate() {
            let target = match argv.iter().position(|w| w == ">") {
                Some(p) if i + 1 == n => {
                    let t = argv.get(p + 1).cloned();
                    argv.truncate(p);
                    t
                }
                _ => None,
            };
            let mut r = self.command(&argv, &input);
            err.push_str(&r.err);
            if let Some(t) = target {
                self.files
                    .insert(t, std::mem::take(&mut r.out).into_bytes());
            }
            input = std::mem::take(&mut r.out);
            last = r;
        }
        Run {
            out: input,
            err,
            code: last.code,
        }
    }

    fn command(&mut self, argv: &[String], input: &str) -> Run {
        let Some(name) = argv.first() else {
            return Run::ok(String::new());
        };
        let args = &argv[1..];
        match name.as_str() {
            "cat" => {
                let mut out = String::new();
                let mut err = String::new();
                for f in args {
                    match self.read(f) {
                        Some(t) => out.push_str(&t),
                        None => err.push_str(&format!("cat: {f}: No such file or directory\n")),
                    }
                }
                let code = i32::from(!err.is_empty());
                Run { out, err, code }
            }
            "ls" => {
                let dir = args.first().map(String::as_str).unwrap_or(".");
                match self.entries(dir) {
                    Some(names) => Run::ok(join_lines(&names)),
                    None => Run::fail(
                        format!("ls: cannot access '{dir}': No such file or directory\n"),
                        2,
                    ),
                }
            }
            "wc" => {
                let f = args.get(1).map(String::as_str).unwrap_or("");
                match self.read(f) {
                    Some(t) => Run::ok(format!("{} {f}\n", t.matches('\n').count())),
                    None => Run::fail(format!("wc: {f}: No such file or directory\n"), 1),
                }
            }
            "head" => {
                let (fl, files) = flags(args, "n");
                let n: usize = value(&fl, 'n').and_then(|v| v.parse().ok()).unwrap_or(10);
                let text = match files.first() {
                    Some(f) => match self.read(f) {
                        Some(t) => t,
                        None => {
                            return Run::fail(format!("head: {f}: No such file or directory\n"), 1)
                        }
                    },
                    None => input.to_string(),
                };
                let ls = lines(&text);
                Run::ok(join_lines(&ls[..n.min(ls.len())]))
            }
            "grep" => self.grep(args, input),
            "sort" => {
                let (fl, _) = flags(args, "");
                let mut ls: Vec<&str> = lines(input);
                let num = leading_number;
                let numeric = has(&fl, 'n');
                let reverse = has(&fl, 'r');
                ls.sort_by(|a, b| {
                    let o = if numeric {
                        num(a)
                            .partial_cmp(&num(b))
                            .unwrap_or(std::cmp::Ordering::Equal)
                    } else {
                        a.cmp(b)
                    };
                    if reverse {
                        o.reverse()
                    } else {
                        o
                    }
                });
                Run::ok(join_lines(&ls))
            }
            "uniq" => {
                let (fl, _) = flags(args, "");
                let mut groups: Vec<(&str, usize)> = Vec::new();
                for l in lines(input) {
                    match groups.last_mut() {
                        Some((p, n)) if *p == l => *n += 1,
                        _ => groups.push((l, 1)),
                    }
                }
                let out = groups
                    .iter()
                    .map(|(l, n)| {
                        if has(&fl, 'c') {
                            format!("{n:7} {l}\n")
                        } else {
                            format!("{l}\n")
                        }
                    })
                    .collect();
                Run::ok(out)
            }
            "cut" => {
                let (fl, files) = flags(args, "df");
                let delim = value(&fl, 'd')
                    .and_then(|d| d.chars().next())
                    .unwrap_or('\t');
                let fields: Vec<usize> = value(&fl, 'f')
                    .unwrap_or("")
                    .split(',')
                    .filter_map(|s| s.parse().ok())
                    .collect();
                let text = match files.first() {
                    Some(f) => match self.read(f) {
                        Some(t) => t,
                        None => {
                            return Run::fail(format!("cut: {f}: No such file or directory\n"), 1)
                        }
                    },
                    None => input.to_string(),
                };
                let out = lines(&text)
                    .iter()
                    .map(|l| {
                        if !l.contains(delim) {
                            return format!("{l}\n");
                        }
                        let f: Vec<&str> = l
                            .split(delim)
                            .enumerate()
                            .filter(|(i, _)| fields.contains(&(i + 1)))
                            .map(|(_, s)| s)
                            .collect();
                        format!("{}\n", f.join(&delim.to_string()))
                    })
                    .collect();
                Run::ok(out)
            }
            "sed" => self.sed_in_place(args),
            other => Run::fail(
                format!("sh: {other}: command not found (try `help`)\n"),
                127,
            ),
        }
    }

    fn grep(&self, args: &[String], input: &str) -> Run {
        let (fl, mut rest) = flags(args, "");
        if rest.is_empty() {
            return Run::fail(
                "grep: usage: grep [-nivcrElhowF] PATTERN [FILE...]\n".into(),
                2,
            );
        }
        let pattern = rest.remove(0);
        let src = if has(&fl, 'E') {
            pattern.clone()
        } else {
            bre_to_ere(&pattern)
        };
        let Ok(re) = regex::Regex::new(&src) else {
            return Run::fail(format!("grep: invalid regular expression '{pattern}'\n"), 2);
        };
        let recursive = has(&fl, 'r');
        let mut err = String::new();
        let mut files = Vec::new();
        if recursive {
            for root in &rest {
                match self.walk(root) {
                    Some(v) => files.extend(v),
                    None => err.push_str(&format!("grep: {root}: No such file or directory\n")),
                }
            }
        } else {
            files = rest.clone();
        }
        let multi = files.len() > 1 || recursive;
        let mut inputs: Vec<(String, String)> = Vec::new();
        if files.is_empty() && !recursive {
            inputs.push(("(standard input)".into(), input.to_string()));
        }
        let mut missing = !err.is_empty();
        for f in &files {
            match self.read(f) {
                Some(t) => inputs.push((f.clone(), t)),
                None => {
                    missing = true;
                    err.push_str(&format!("grep: {f}: No such file or directory\n"));
                }
            }
        }
        let (invert, count, list, number) =
            (has(&fl, 'v'), has(&fl, 'c'), has(&fl, 'l'), has(&fl, 'n'));
        let mut out = String::new();
        let mut any = false;
        for (name, text) in &inputs {
            let mut n = 0usize;
            for (i, l) in lines(text).into_iter().enumerate() {
                if re.is_match(l) == invert {
                    continue;
                }
                n += 1;
                any = true;
                if list {
                    break;
                }
                if count {
                    continue;
                }
                let prefix = grep_prefix(name, i + 1, multi, number);
                out.push_str(&format!("{prefix}{l}\n"));
            }
            if list && n > 0 {
                out.push_str(&format!("{name}\n"));
            } else if count && !list {
                if multi {
                    out.push_str(&format!("{name}:{n}\n"));
                } else {
                    out.push_str(&format!("{n}\n"));
                }
            }
        }
        let code = if missing {
            2
        } else if any {
            0
        } else {
            1
        };
        Run { out, err, code }
    }

    /// `sed -i 'SCRIPT' FILE`: `s/RE/REP/` commands separated by `;` (no `&`, `\N` or
    /// flags), applied to every line in order.
    fn sed_in_place(&mut self, args: &[String]) -> Run {
        let (fl, rest) = flags(args, "");
        let (Some(script), Some(file)) = (rest.first(), rest.get(1)) else {
            return Run::fail("sed: usage: sed -i SCRIPT FILE...\n".into(), 2);
        };
        if !has(&fl, 'i') {
            return Run::fail("sed: the simulator only runs `sed -i`\n".into(), 2);
        }
        let mut rules = Vec::new();
        for cmd in script.split(';').filter(|c| !c.trim().is_empty()) {
            let parts: Vec<&str> = cmd.trim().splitn(4, '/').collect();
            let ["s", re, rep, _] = parts.as_slice() else {
                return Run::fail(format!("sed: cannot parse script '{script}'\n"), 1);
            };
            let Ok(re) = regex::Regex::new(&bre_to_ere(re)) else {
                return Run::fail(format!("sed: invalid regular expression '{re}'\n"), 1);
            };
            rules.push((re, rep.replace('$', "$$")));
        }
        let Some(text) = self.read(file) else {
            return Run::fail(format!("sed: {file}: No such file or directory\n"), 2);
        };
        let out: String = lines(&text)
            .iter()
            .map(|l| {
                let mut l = l.to_string();
                for (re, rep) in &rules {
                    l = re.replacen(&l, 1, rep.as_str()).into_owned();
                }
                format!("{l}\n")
            })
            .collect();
        self.files.insert(file.clone(), out.into_bytes());
        Run::ok(String::new())
    }
}
