//! Span diagnostics: every problem in a pack is reported at a line and column of its TOML
//! source, with what to write instead, so that an author can fix it without searching.
//!
//! TOML spans often cover a whole table; [`narrow`] and [`narrow_key`] find the line inside
//! it that actually holds the offending value or key.

use std::fmt;
use std::ops::Range;

/// One problem in a pack, located in its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackDiagnostic {
    /// The pack file.
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// What is wrong.
    pub message: String,
    /// What to write instead.
    pub hint: String,
}

impl fmt::Display for PackDiagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}\n  write instead: {}",
            self.file, self.line, self.column, self.message, self.hint
        )
    }
}

/// Where `needle` first occurs inside the table that starts at `span` (its span, or up to the
/// next table header when the span covers only the header), so that a diagnostic points at
/// the line that uses a value rather than at its table; `span` if it does not occur there.
pub(super) fn narrow(src: &str, span: &Range<usize>, needle: &str) -> Range<usize> {
    let Range { start, end } = table_range(src, span);
    match src[start..end].find(needle) {
        Some(i) => start + i..start + i + needle.len(),
        None => span.clone(),
    }
}

/// The text of the table that starts at `span`: its span, or up to the next table header
/// when the span covers only the header.
fn table_range(src: &str, span: &Range<usize>) -> Range<usize> {
    let start = span.start.min(src.len());
    let next_header = src[start..]
        .match_indices("\n[")
        .map(|(i, _)| start + i)
        .find(|&i| i >= span.end)
        .unwrap_or(src.len());
    start..span.end.max(next_header).min(src.len())
}

/// Where `key = …` is written inside the table that starts at `span` (the key at a line's
/// start or after `{` or `,`, then `=`), so that a diagnostic points at the key even when
/// its name also occurs earlier in the table (`command` in `kind = "command_exit"`);
/// [`narrow`] to the key's name if it is not written that way.
pub(super) fn narrow_key(src: &str, span: &Range<usize>, key: &str) -> Range<usize> {
    let Range { start, end } = table_range(src, span);
    let table = &src[start..end];
    let found = table.match_indices(key).map(|(i, _)| i).find(|&i| {
        let before = table[..i].trim_end_matches([' ', '\t']);
        let after = table[i + key.len()..].trim_start_matches([' ', '\t']);
        (before.is_empty() || before.ends_with(['\n', '{', ','])) && after.starts_with('=')
    });
    match found {
        Some(i) => start + i..start + i + key.len(),
        None => narrow(src, span, key),
    }
}

/// The diagnostics found so far in one pack's source.
pub(super) struct Diags<'a> {
    /// The pack file, as diagnostics name it.
    pub(super) file: &'a str,
    /// Its text, which spans index.
    pub(super) src: &'a str,
    /// What was found, in the order found.
    pub(super) out: Vec<PackDiagnostic>,
}

impl Diags<'_> {
    /// Adds a diagnostic at the line and column where `span` starts.
    pub(super) fn push(
        &mut self,
        span: Range<usize>,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) {
        let start = span.start.min(self.src.len());
        let before = &self.src[..start];
        let line = before.matches('\n').count() + 1;
        let column = before.len() - before.rfind('\n').map(|i| i + 1).unwrap_or(0) + 1;
        self.out.push(PackDiagnostic {
            file: self.file.to_string(),
            line,
            column,
            message: message.into(),
            hint: hint.into(),
        });
    }
}

/// What to write instead, for the TOML parser's error `msg` (the pack is not valid TOML,
/// or does not fit the schema).
pub(super) fn toml_error_hint(msg: &str) -> &'static str {
    if msg.contains("unknown field") {
        "remove the key or fix its spelling (see docs/tasks.md for the fields)"
    } else if msg.contains("missing field") {
        "add the missing key (see docs/tasks.md for a complete pack)"
    } else if msg.contains("invalid type") {
        "use the type the message names, e.g. a number without quotes"
    } else {
        "valid TOML: `key = value`, strings in quotes, tables as [name]"
    }
}
