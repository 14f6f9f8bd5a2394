//! The text commands: sort, uniq, cut, tr, echo, printf and seq.

use std::io;

use corvid_shell_syntax::leading_number;

use super::{getopt, has, inputs, lines, unknown_flag, value, write_line, Io};

fn field_split(line: &str, sep: Option<char>) -> Vec<&str> {
    match sep {
        Some(c) => line.split(c).collect(),
        None => line.split_whitespace().collect(),
    }
}

pub(super) fn sort(io: &mut Io, args: &[String]) -> io::Result<i32> {
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
    let num = leading_number;
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

pub(super) fn uniq(io: &mut Io, args: &[String]) -> io::Result<i32> {
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

pub(super) fn cut(io: &mut Io, args: &[String]) -> io::Result<i32> {
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

pub(super) fn tr(io: &mut Io, args: &[String]) -> io::Result<i32> {
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

pub(super) fn echo(io: &mut Io, args: &[String]) -> io::Result<i32> {
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

pub(super) fn printf(io: &mut Io, args: &[String]) -> io::Result<i32> {
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

fn parse_num(s: &str) -> Option<i64> {
    s.trim().parse().ok()
}

pub(super) fn seq(io: &mut Io, args: &[String]) -> io::Result<i32> {
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
