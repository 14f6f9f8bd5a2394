//! Templating: `{name}` placeholders, rendering a template (or every string of a TOML
//! value) with an assignment of the variables, and the assignments validation renders
//! with.
//!
//! An instance renders each template with the values it draws. Validation cannot try
//! every value a pack can draw, so [`assignments`] enumerates a bounded set that still
//! tries every single value of every variable, and [`first_bad_rendering`] runs a check
//! over them and reports the first failure with how many failed.

use std::collections::{BTreeMap, BTreeSet};

use super::schema::{RawLevel, RawPack, RawVar};

/// The `{name}` placeholders of a template, or the byte offset of an unclosed `{`. `{{`
/// and `}}` are a literal brace, as in Python's `str.format` (Python code in a pack writes
/// `{{}}` for an empty dict).
pub(super) fn placeholders(t: &str) -> Result<Vec<String>, usize> {
    let mut out = Vec::new();
    let mut i = 0;
    let b = t.as_bytes();
    while i < b.len() {
        match b[i] {
            b'{' if b.get(i + 1) == Some(&b'{') => i += 2,
            b'}' if b.get(i + 1) == Some(&b'}') => i += 2,
            b'{' => {
                let Some(j) = t[i + 1..].find('}') else {
                    return Err(i);
                };
                out.push(t[i + 1..i + 1 + j].to_string());
                i += j + 2;
            }
            _ => i += 1,
        }
    }
    Ok(out)
}

/// Replaces every `{name}` with its value and `{{`, `}}` with one brace (unknown names are
/// left as they are; validation rejects them before an instance is ever built).
pub(super) fn render(t: &str, vars: &BTreeMap<String, String>) -> String {
    let mut s = String::with_capacity(t.len());
    let mut rest = t;
    while let Some(i) = rest.find(['{', '}']) {
        s.push_str(&rest[..i]);
        let tail = &rest[i..];
        if tail.starts_with("{{") || tail.starts_with("}}") {
            s.push_str(&tail[..1]);
            rest = &tail[2..];
            continue;
        }
        if tail.starts_with('{') {
            if let Some(j) = tail.find('}') {
                match vars.get(&tail[1..j]) {
                    Some(v) => s.push_str(v),
                    None => s.push_str(&tail[..=j]),
                }
                rest = &tail[j + 1..];
                continue;
            }
        }
        s.push_str(&tail[..1]);
        rest = &tail[1..];
    }
    s.push_str(rest);
    s
}

/// Renders every string inside a TOML value.
pub(super) fn render_value(v: &toml::Value, vars: &BTreeMap<String, String>) -> toml::Value {
    match v {
        toml::Value::String(s) => toml::Value::String(render(s, vars)),
        toml::Value::Array(a) => {
            toml::Value::Array(a.iter().map(|x| render_value(x, vars)).collect())
        }
        toml::Value::Table(t) => toml::Value::Table(
            t.iter()
                .map(|(k, x)| (k.clone(), render_value(x, vars)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Every string inside a TOML value.
pub(super) fn strings(v: &toml::Value, out: &mut Vec<String>) {
    match v {
        toml::Value::String(s) => out.push(s.clone()),
        toml::Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
        toml::Value::Table(t) => t.values().for_each(|x| strings(x, out)),
        _ => {}
    }
}

/// At most this many renderings of one template are checked per level (the cartesian
/// product of its variables' values). Past it, validation renders the "diagonal" instead:
/// rendering `i` takes value `i mod len` of every variable, so every single value is
/// still tried, though not every combination of values.
const MAX_RENDERINGS: usize = 4096;

/// An integer range of at most this many values is rendered value by value; a wider one
/// only at its two ends (the longest renderings, and both signs if it spans zero).
const RANGE_ALL_VALUES: i128 = 16;

/// The values of a variable that validation renders templates with, as strings (what
/// [`TaskFamily::instance`](crate::TaskFamily::instance) could draw; nothing for a spec
/// that validation rejects).
fn var_values(v: &RawVar) -> Vec<String> {
    match (&v.choices, v.min, v.max) {
        (Some(c), _, _) => c.clone(),
        (None, Some(lo), Some(hi)) if lo > hi => Vec::new(),
        (None, Some(lo), Some(hi)) if i128::from(hi) - i128::from(lo) < RANGE_ALL_VALUES => {
            (lo..=hi).map(|x| x.to_string()).collect()
        }
        (None, Some(lo), Some(hi)) => vec![lo.to_string(), hi.to_string()],
        _ => vec![String::new()],
    }
}

/// The assignments of the declared variables among `names` that validation renders a
/// template with: for every level (its overrides over `[vars]`), the product of the
/// variables' [`var_values`], or its diagonal past [`MAX_RENDERINGS`].
fn assignments(raw: &RawPack, names: &BTreeSet<&str>) -> BTreeSet<BTreeMap<String, String>> {
    let levels = raw.levels.get_ref();
    let specs: Vec<Option<&RawLevel>> = if levels.is_empty() {
        vec![None]
    } else {
        levels.iter().map(|l| Some(l.get_ref())).collect()
    };
    let mut out = BTreeSet::new();
    for level in specs {
        let sets: Vec<(&str, Vec<String>)> = names
            .iter()
            .filter_map(|&n| {
                let base = raw.vars.get(n)?;
                let v = level.and_then(|l| l.vars.get(n)).unwrap_or(base);
                Some((n, var_values(v.get_ref())))
            })
            .collect();
        let lens: Vec<usize> = sets.iter().map(|(_, v)| v.len()).collect();
        let product = lens.iter().try_fold(1usize, |acc, &l| acc.checked_mul(l));
        let at = |index: &[usize]| -> BTreeMap<String, String> {
            sets.iter()
                .zip(index)
                .map(|((n, vs), &i)| (n.to_string(), vs[i].clone()))
                .collect()
        };
        match product {
            Some(0) => {}
            Some(total) if total <= MAX_RENDERINGS => {
                // Odometer over every combination.
                let mut index = vec![0; sets.len()];
                for _ in 0..total {
                    out.insert(at(&index));
                    for (i, l) in index.iter_mut().zip(&lens) {
                        *i += 1;
                        if *i < *l {
                            break;
                        }
                        *i = 0;
                    }
                }
            }
            _ => {
                let longest = lens.iter().copied().max().unwrap_or(0);
                for k in 0..longest {
                    let index: Vec<usize> = lens.iter().map(|l| k % l).collect();
                    out.insert(at(&index));
                }
            }
        }
    }
    out
}

/// A rendering of a template that a check rejects.
pub(super) struct BadRendering<R = String> {
    /// The first rejected assignment (in sorted order) and its rendering.
    pub(super) vars: BTreeMap<String, String>,
    pub(super) rendered: String,
    /// Why it was rejected.
    pub(super) reason: R,
    /// Rejected / rendered assignments.
    pub(super) failed: usize,
    pub(super) checked: usize,
}

impl<R> BadRendering<R> {
    /// `a = "x", b = "y"`.
    pub(super) fn vars(&self) -> String {
        self.vars
            .iter()
            .map(|(n, v)| format!("{n} = {v:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `a`, `b`.
    pub(super) fn names(&self) -> String {
        self.vars
            .keys()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Renders `templates` together with every [`assignments`] of the declared variables they
/// use and runs `check` on each set of renderings (in the order of `templates`); the first
/// rejected one, if any, with `rendered` the rendering of the first template. `None` too
/// when a template has an unclosed `{` (reported with the other template errors).
pub(super) fn first_bad_rendering<R>(
    raw: &RawPack,
    declared: &BTreeSet<&str>,
    templates: &[&str],
    check: impl Fn(&[String]) -> Result<(), R>,
) -> Option<BadRendering<R>> {
    let mut names = BTreeSet::new();
    for t in templates {
        let used = placeholders(t).ok()?;
        names.extend(
            used.iter()
                .filter_map(|n| declared.get(n.as_str()).copied()),
        );
    }
    let all = assignments(raw, &names);
    let mut bad: Option<BadRendering<R>> = None;
    let mut failed = 0;
    for vars in &all {
        let rendered: Vec<String> = templates.iter().map(|t| render(t, vars)).collect();
        if let Err(reason) = check(&rendered) {
            failed += 1;
            bad.get_or_insert(BadRendering {
                vars: vars.clone(),
                rendered: rendered.into_iter().next().unwrap_or_default(),
                reason,
                failed: 0,
                checked: 0,
            });
        }
    }
    bad.map(|b| BadRendering {
        failed,
        checked: all.len(),
        ..b
    })
}

/// One assignment of the `[vars]`: each variable's `min`, or its first choice. Validation
/// parses the checker and the process rewards rendered with it, as an instance renders
/// them with the values it draws.
pub(super) fn sample(raw: &RawPack) -> BTreeMap<String, String> {
    raw.vars
        .iter()
        .map(|(n, v)| {
            let v = v.get_ref();
            let x = v
                .min
                .map(|m| m.to_string())
                .or_else(|| v.choices.as_ref().and_then(|c| c.first().cloned()));
            (n.clone(), x.unwrap_or_default())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn double_braces_are_literal_and_values_are_not_rendered_again() {
        let vars = BTreeMap::from([
            ("item".to_string(), "{n}".to_string()),
            ("n".to_string(), "3".to_string()),
        ]);
        let t = "d = {{}}; print(f\"{{d}} {item}\") # {n}}}";
        assert_eq!(placeholders(t), Ok(vec!["item".into(), "n".into()]));
        assert_eq!(render(t, &vars), "d = {}; print(f\"{d} {n}\") # 3}");
        assert_eq!(render("{other} {", &vars), "{other} {");
        assert_eq!(placeholders("a {b"), Err(2));
        assert_eq!(placeholders("{{b"), Ok(vec![]));
    }
}
