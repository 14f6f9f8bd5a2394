//! Turning raw tool output into the text shown to the model: lossy UTF-8,
//! control characters made inert, host paths and toolchain paths redacted,
//! and head + tail kept around a marker when the text is too long.

use crate::limits::MAX_SHOWN_BYTES;

/// Escapes control characters other than `\n` and `\t` as `\xNN`, so ANSI
/// sequences reach the model (and any terminal) as inert text.
pub(crate) fn inert(s: &str) -> String {
    // Controls are C0 and DEL (single bytes) and C1 (U+0080..=U+009F, encoded
    // 0xC2 0x80..=0x9F). Text without such bytes, nearly all tool output, is
    // copied as is instead of char by char.
    let maybe_control = s
        .bytes()
        .any(|b| (b < 0x20 && b != b'\n' && b != b'\t') || b == 0x7f || b == 0xc2);
    if !maybe_control {
        return s.to_owned();
    }
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            out.push_str(&format!("\\x{:02x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// Replaces each `(host, guest)` path prefix, and toolchain source paths
/// (`/rustc/<hash>/`), so no host path reaches the model.
pub(crate) fn redact(mut s: String, host_paths: &[(String, String)]) -> String {
    for (host, guest) in host_paths {
        if !host.is_empty() && s.contains(host.as_str()) {
            s = s.replace(host.as_str(), guest);
        }
    }
    // Rust's default panic hook suggests an environment variable; drop it.
    if s.contains("RUST_BACKTRACE") {
        s = s
            .lines()
            .filter(|l| !l.contains("RUST_BACKTRACE"))
            .collect::<Vec<_>>()
            .join("\n")
            + if s.ends_with('\n') { "\n" } else { "" };
    }
    while let Some(i) = s.find("/rustc/") {
        let rest = &s[i + 7..];
        let end = rest.find('/').map(|j| i + 7 + j + 1).unwrap_or(s.len());
        s.replace_range(i..end, "<rust>/");
    }
    s
}

/// Keeps the first and last `MAX_SHOWN_BYTES / 2` bytes (on char
/// boundaries) around a marker saying how many bytes were cut.
pub(crate) fn truncate(s: String) -> (String, bool) {
    truncate_to(s, MAX_SHOWN_BYTES)
}

pub(crate) fn truncate_to(s: String, max: usize) -> (String, bool) {
    if s.len() <= max {
        return (s, false);
    }
    let half = max / 2;
    let mut head_end = half;
    while !s.is_char_boundary(head_end) {
        head_end -= 1;
    }
    let mut tail_start = s.len() - half;
    while !s.is_char_boundary(tail_start) {
        tail_start += 1;
    }
    let cut = tail_start - head_end;
    let text = format!(
        "{}\n[... {cut} bytes truncated ...]\n{}",
        &s[..head_end],
        &s[tail_start..]
    );
    (text, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_keeps_head_and_tail_and_counts_the_cut() {
        let s = format!("{}{}", "a".repeat(20_000), "z".repeat(20_000));
        let (t, cut) = truncate(s);
        assert!(cut);
        assert!(t.starts_with("aaaa") && t.ends_with("zzzz"));
        assert!(t.contains(&format!(
            "[... {} bytes truncated ...]",
            40_000 - MAX_SHOWN_BYTES
        )));
    }

    #[test]
    fn truncation_respects_char_boundaries() {
        let s = "é".repeat(20_000);
        let (t, cut) = truncate(s);
        assert!(cut && t.len() < MAX_SHOWN_BYTES + 64);
    }

    #[test]
    fn control_characters_become_inert() {
        assert_eq!(inert("a\x1b[31mb\n"), "a\\x1b[31mb\n");
        assert_eq!(inert("del\x7f c1\u{85} \u{9f}"), "del\\x7f c1\\x85 \\x9f");
        // Printable text (with and without 0xC2-led characters) is unchanged.
        for s in ["plain\ttext\n", "\u{a0}£é漢\n", ""] {
            assert_eq!(inert(s), s);
        }
    }

    #[test]
    fn host_and_toolchain_paths_are_redacted() {
        let s = redact(
            "/tmp/x/ws/a.txt and /rustc/0123abcd/library/std/src/x.rs".into(),
            &[("/tmp/x/ws".into(), "/workspace".into())],
        );
        assert_eq!(s, "/workspace/a.txt and <rust>/library/std/src/x.rs");
    }
}
