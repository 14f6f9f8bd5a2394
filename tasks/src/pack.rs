//! Task packs: data-defined task families in TOML (`tasks/packs/*.toml`).
//!
//! A pack declares template variables, the tools it allows, its levels, a prompt and
//! initial files (templated with `{var}`), a checker, process-reward rules and an oracle
//! plan. `docs/tasks.md` documents the format; [`load_pack`] parses and validates one,
//! reporting every error with `file:line:column` and what to write instead.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::ops::Range;

use serde::Deserialize;
use toml::Spanned;

use crate::checker::{check_shell_line, Checker, ShellLineProblem};
use crate::error::TasksError;
use crate::families::PlanBuilder;
use crate::process::ProcessRule;
use crate::rng::SplitMix64;
use crate::task::{
    check_level, CustomToolDecl, OraclePlan, ReadOnlyData, TaskFamily, TaskInstance, ToolLimits,
    ToolSpec, KNOWN_TOOLS,
};

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

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMeta {
    name: Spanned<String>,
    #[serde(default)]
    description: String,
}

/// A template variable: an integer range or a list of choices.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawVar {
    min: Option<i64>,
    max: Option<i64>,
    choices: Option<Vec<String>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLevel {
    level: Spanned<u32>,
    max_turns: Spanned<u32>,
    context_budget: Spanned<u32>,
    #[serde(default)]
    vars: BTreeMap<String, Spanned<RawVar>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCall {
    tool: Spanned<String>,
    #[serde(default)]
    args: toml::Table,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOracle {
    #[serde(default)]
    calls: Vec<Spanned<RawCall>>,
    answer: Spanned<String>,
}

/// `[custom_tools.NAME]`: a WASI preview-1 module the pack registers as a tool.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCustomTool {
    description: Spanned<String>,
    /// Relative to the pack file.
    module: Spanned<String>,
    #[serde(default)]
    workspace_writable: bool,
    fuel: Option<Spanned<u64>>,
    memory_mib: Option<Spanned<u64>>,
    timeout_ms: Option<Spanned<u64>>,
    output_bytes: Option<Spanned<u64>>,
}

/// Bounds of a custom tool's limits in a pack (the sandbox's own bounds, in the
/// pack's units).
const FUEL_RANGE: (u64, u64) = (1, 1 << 40);
const MEMORY_MIB_RANGE: (u64, u64) = (1, corvid_sandbox::limits::POOL_MAX_MEMORY_BYTES >> 20);
const TIMEOUT_MS_RANGE: (u64, u64) = (10, 600_000);
const OUTPUT_BYTES_RANGE: (u64, u64) = (1, 64 << 20);

impl RawCustomTool {
    /// The sandbox limits this declaration asks for (defaults for the keys it leaves out).
    fn limits(&self) -> corvid_sandbox::Limits {
        let d = corvid_sandbox::Limits::default();
        let tick_ms = corvid_sandbox::limits::EPOCH_TICK.as_millis() as u64;
        corvid_sandbox::Limits {
            fuel: self.fuel.as_ref().map_or(d.fuel, |f| *f.get_ref()),
            deadline_ticks: self
                .timeout_ms
                .as_ref()
                .map_or(d.deadline_ticks, |t| t.get_ref().div_ceil(tick_ms)),
            memory_bytes: self
                .memory_mib
                .as_ref()
                .map_or(d.memory_bytes, |m| m.get_ref() << 20),
            stdout_bytes: self
                .output_bytes
                .as_ref()
                .map_or(d.stdout_bytes, |o| *o.get_ref()),
            stderr_bytes: d.stderr_bytes,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPack {
    pack: RawMeta,
    #[serde(default)]
    vars: BTreeMap<String, Spanned<RawVar>>,
    tools: Spanned<BTreeMap<String, Spanned<ToolLimits>>>,
    #[serde(default)]
    custom_tools: BTreeMap<String, Spanned<RawCustomTool>>,
    levels: Spanned<Vec<Spanned<RawLevel>>>,
    prompt: Spanned<String>,
    /// Path template (spanned, so that a bad path is reported at its key) → content template.
    #[serde(default)]
    files: BTreeMap<Spanned<String>, Spanned<String>>,
    checker: Spanned<toml::Value>,
    #[serde(default)]
    process_rewards: Vec<Spanned<toml::Value>>,
    oracle: Spanned<RawOracle>,
}

/// A parsed, validated task pack; a [`TaskFamily`].
#[derive(Debug, Clone)]
pub struct TaskPack {
    file: String,
    raw: RawPack,
}

/// Where `needle` first occurs inside the table that starts at `span` (its span, or up to the
/// next table header when the span covers only the header), so that a diagnostic points at
/// the line that uses a value rather than at its table; `span` if it does not occur there.
fn narrow(src: &str, span: &Range<usize>, needle: &str) -> Range<usize> {
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
fn narrow_key(src: &str, span: &Range<usize>, key: &str) -> Range<usize> {
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

struct Diags<'a> {
    file: &'a str,
    src: &'a str,
    out: Vec<PackDiagnostic>,
}

impl Diags<'_> {
    fn push(&mut self, span: Range<usize>, message: impl Into<String>, hint: impl Into<String>) {
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

/// The `{name}` placeholders of a template, or the byte offset of an unclosed `{`.
fn placeholders(t: &str) -> Result<Vec<String>, usize> {
    let mut out = Vec::new();
    let mut rest = t;
    let mut offset = 0;
    while let Some(i) = rest.find('{') {
        let after = &rest[i + 1..];
        let Some(j) = after.find('}') else {
            return Err(offset + i);
        };
        out.push(after[..j].to_string());
        offset += i + 1 + j + 1;
        rest = &after[j + 1..];
    }
    Ok(out)
}

/// Replaces every `{name}` with its value (unknown names are left as they are; validation
/// rejects them before an instance is ever built).
fn render(t: &str, vars: &BTreeMap<String, String>) -> String {
    let mut s = t.to_string();
    for (k, v) in vars {
        s = s.replace(&format!("{{{k}}}"), v);
    }
    s
}

/// Renders every string inside a TOML value.
fn render_value(v: &toml::Value, vars: &BTreeMap<String, String>) -> toml::Value {
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
fn strings(v: &toml::Value, out: &mut Vec<String>) {
    match v {
        toml::Value::String(s) => out.push(s.clone()),
        toml::Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
        toml::Value::Table(t) => t.values().for_each(|x| strings(x, out)),
        _ => {}
    }
}

fn check_var(d: &mut Diags<'_>, name: &str, v: &Spanned<RawVar>) {
    let r = v.get_ref();
    match (r.min, r.max, &r.choices) {
        (Some(lo), Some(hi), None) if lo <= hi => {}
        (Some(lo), Some(hi), None) => d.push(
            v.span(),
            format!("variable `{name}` has min {lo} > max {hi}"),
            format!("{name} = {{ min = {hi}, max = {lo} }}"),
        ),
        (None, None, Some(c)) if !c.is_empty() => {}
        (None, None, Some(_)) => d.push(
            v.span(),
            format!("variable `{name}` has an empty choice list"),
            format!("{name} = {{ choices = [\"a\", \"b\"] }}"),
        ),
        _ => d.push(
            v.span(),
            format!("variable `{name}` must be an integer range or a choice list"),
            format!("{name} = {{ min = 1, max = 9 }}  or  {name} = {{ choices = [\"a\", \"b\"] }}"),
        ),
    }
}

/// Validates one `[custom_tools.NAME]` declaration: the name, that `[tools]` allows it,
/// the module file (relative to the pack file: present, not too big, a wasm binary) and
/// every limit's range.
fn check_custom_tool(d: &mut Diags<'_>, name: &str, c: &Spanned<RawCustomTool>, allowed: bool) {
    let name_ok = name.len() <= 64
        && name.starts_with(|ch: char| ch.is_ascii_lowercase())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !name_ok || KNOWN_TOOLS.contains(&name) {
        d.push(
            c.span(),
            format!(
                "custom tool name {name:?} must be [a-z][a-z0-9_]{{0,63}} and not a built-in tool"
            ),
            "[custom_tools.word_count]",
        );
    }
    if !allowed {
        d.push(
            c.span(),
            format!("custom tool `{name}` is declared but [tools] does not allow it"),
            format!("{name} = {{}} under [tools]"),
        );
    }
    let r = c.get_ref();
    if r.description.get_ref().trim().is_empty() {
        d.push(
            r.description.span(),
            "the description is empty (the model reads it to know what the tool does)",
            "description = \"Counts the lines of the files named in args.\"",
        );
    }
    let hint = "module = \"wasm/tool.wasm\" (a WASI preview-1 command, relative to the pack file)";
    if let Some(bad) = module_problem(d.file, r.module.get_ref(), hint) {
        d.push(r.module.span(), bad.message, bad.hint);
    }
    let ranges = [
        ("fuel", &r.fuel, FUEL_RANGE),
        ("memory_mib", &r.memory_mib, MEMORY_MIB_RANGE),
        ("timeout_ms", &r.timeout_ms, TIMEOUT_MS_RANGE),
        ("output_bytes", &r.output_bytes, OUTPUT_BYTES_RANGE),
    ];
    for (key, value, (lo, hi)) in ranges {
        if let Some(v) = value {
            if !(lo..=hi).contains(v.get_ref()) {
                d.push(
                    v.span(),
                    format!("{key} = {} is outside {lo}..={hi}", v.get_ref()),
                    format!("{key} = {}", (*v.get_ref()).clamp(lo, hi)),
                );
            }
        }
    }
}

/// Why a WASI module named in a pack cannot be loaded, and what would be valid.
struct ModuleProblem {
    message: String,
    hint: String,
}

/// Checks the module file `module` (a path relative to the pack file `pack_file`) as the
/// sandbox will load it: a relative path, a file that exists, at most
/// `MAX_CUSTOM_MODULE_BYTES`, a wasm binary. `hint` is the valid form of the key that
/// names it, for a path that is absolute or missing.
fn module_problem(pack_file: &str, module: &str, hint: &str) -> Option<ModuleProblem> {
    let bad = |message: String, hint: &str| {
        Some(ModuleProblem {
            message,
            hint: hint.to_string(),
        })
    };
    if module.is_empty() || std::path::Path::new(module).is_absolute() {
        return bad(
            "the module path must be relative to the pack file".into(),
            hint,
        );
    }
    let path = std::path::Path::new(pack_file)
        .parent()
        .unwrap_or(std::path::Path::new(""))
        .join(module);
    let max = corvid_sandbox::limits::MAX_CUSTOM_MODULE_BYTES;
    match std::fs::metadata(&path) {
        Err(e) => bad(
            format!("cannot read module {}: {e}", path.display()),
            &format!(
                "{hint}; build one for wasm32-wasip1 (docs/sandbox.md, \"Adding your own tool\"), \
                 or put the sandbox's own toolbox there: corvid sandbox toolbox --out {}",
                path.display()
            ),
        ),
        Ok(m) if m.len() > max as u64 => bad(
            format!("module is {} bytes; the limit is {max}", m.len()),
            "a smaller module (build with opt-level \"s\", lto, strip)",
        ),
        Ok(_) => {
            let mut magic = [0u8; 4];
            let is_wasm = std::fs::File::open(&path)
                .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
                .is_ok()
                && &magic == b"\0asm";
            if is_wasm {
                None
            } else {
                bad(
                    format!("{} is not a wasm binary", path.display()),
                    "a .wasm file built for wasm32-wasip1 (text .wat is not accepted)",
                )
            }
        }
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
/// [`TaskFamily::instance`] could draw; nothing for a spec that [`check_var`] rejects).
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
struct BadRendering<R = String> {
    /// The first rejected assignment (in sorted order) and its rendering.
    vars: BTreeMap<String, String>,
    rendered: String,
    /// Why it was rejected.
    reason: R,
    /// Rejected / rendered assignments.
    failed: usize,
    checked: usize,
}

impl<R> BadRendering<R> {
    /// `a = "x", b = "y"`.
    fn vars(&self) -> String {
        self.vars
            .iter()
            .map(|(n, v)| format!("{n} = {v:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `a`, `b`.
    fn names(&self) -> String {
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
fn first_bad_rendering<R>(
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

/// Why the sandbox would refuse `p` as a path of a workspace's initial files, if it would.
fn workspace_path_problem(p: &str) -> Option<&'static str> {
    corvid_sandbox::check_rel_path(p).err()
}

/// `p` made into a path the sandbox accepts, for a hint: forbidden characters and empty,
/// `.` and `..` components dropped.
fn clean_workspace_path(p: &str) -> String {
    let p: String = p
        .chars()
        .filter(|&c| !corvid_sandbox::forbidden_char(c))
        .collect();
    let clean = p
        .split('/')
        .filter(|c| !c.is_empty() && *c != "." && *c != "..")
        .collect::<Vec<_>>()
        .join("/");
    if clean.is_empty() {
        "notes.txt".to_string()
    } else {
        clean
    }
}

/// How errors name the keys of one map of workspace paths of a pack: the `[files]` paths,
/// or a `file_state` checker's. Both are templates rendered with the instance's variables;
/// both must render to paths the sandbox accepts, and to distinct ones (a map holds one
/// value per path: another key rendered to it would be lost); `[files]` paths also to
/// paths none of which is a folder of another (see [`Clash`]).
struct PathKeys {
    /// One key, as errors name it: `[files] path`.
    one: &'static str,
    /// Two keys: `[files] paths`.
    two: &'static str,
    /// What happens to an instance with an invalid key.
    refused: &'static str,
    /// Whether `instance()` refuses an invalid rendered key itself (the sandbox refuses an
    /// invalid `[files]` path by name when the episode starts; no workspace checks a
    /// checker's).
    instance_checks: bool,
    /// What two keys rendered to one path would lose.
    lost: &'static str,
    /// Whether a key rendered to a folder of another's path is an error (files need their
    /// folders; expectations do not: `a` may be expected absent beside `a/b`).
    nested: bool,
}

/// The `[files]` paths.
const FILES: PathKeys = PathKeys {
    one: "[files] path",
    two: "[files] paths",
    refused: "the sandbox refuses it",
    instance_checks: false,
    lost: "one file's content would replace the other's",
    nested: true,
};

/// A `file_state` checker's paths.
const FILE_STATE: PathKeys = PathKeys {
    one: "checker file_state key",
    two: "checker file_state keys",
    refused: "instances refuse it (no workspace holds such a path)",
    instance_checks: true,
    lost: "one expectation would replace the other",
    nested: false,
};

/// Why two rendered paths of one map of workspace paths cannot both be in it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Clash {
    /// Both are this path.
    Same(String),
    /// The two paths, in the order compared, one of which is a folder of the other: the
    /// sandbox would have to create it as a file and as a folder at once, and cannot create
    /// the workspace (`a.txt` and `a.txt/b.txt`).
    Nested([String; 2]),
}

impl Clash {
    /// How the rendered paths `a` and `b` of `keys` clash, if they do. Paths are compared by
    /// their components: a path the sandbox accepts has nothing to normalise (no leading
    /// '/', no empty, `.` or `..` component; [`workspace_path_problem`]), and one it refuses
    /// is reported on its own, so it is compared only as written, for equality.
    fn find(keys: &PathKeys, a: &str, b: &str) -> Option<Self> {
        if a == b {
            return Some(Self::Same(a.to_string()));
        }
        if !keys.nested
            || workspace_path_problem(a).is_some()
            || workspace_path_problem(b).is_some()
        {
            return None;
        }
        let (ca, cb): (Vec<&str>, Vec<&str>) = (a.split('/').collect(), b.split('/').collect());
        (cb.starts_with(&ca) || ca.starts_with(&cb))
            .then(|| Self::Nested([a.to_string(), b.to_string()]))
    }

    /// What the two templates render to: `both render to "p"`, or
    /// `render to "a.txt" and "a.txt/b.txt"`.
    fn rendered(&self) -> String {
        match self {
            Self::Same(p) => format!("both render to {p:?}"),
            Self::Nested([a, b]) => format!("render to {a:?} and {b:?}"),
        }
    }

    /// What the clash breaks.
    fn consequence(&self, keys: &PathKeys) -> String {
        match self {
            Self::Same(_) => keys.lost.to_string(),
            Self::Nested(paths) => {
                let [folder, file] = if paths[0].len() < paths[1].len() {
                    [&paths[0], &paths[1]]
                } else {
                    [&paths[1], &paths[0]]
                };
                format!(
                    "{folder:?} would be both a file and the folder of {file:?}, which the sandbox cannot create"
                )
            }
        }
    }
}

/// Renders the path templates of `entries` with `vars`, keeping each value. A rendered
/// path the sandbox refuses (where `keys.instance_checks`) and two templates whose renderings [`Clash`] are
/// errors naming the templates and what they rendered to.
fn render_paths<V>(
    keys: &PathKeys,
    entries: impl IntoIterator<Item = (String, V)>,
    vars: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, V>, String> {
    let mut out = BTreeMap::new();
    // (template, rendering) of the entries so far.
    let mut seen: Vec<(String, String)> = Vec::new();
    for (t, v) in entries {
        let p = render(&t, vars);
        if let Some(why) = workspace_path_problem(&p).filter(|_| keys.instance_checks) {
            return Err(format!(
                "{} {t:?} renders to {p:?}, which is not a valid workspace path: {why}",
                keys.one
            ));
        }
        for (first, q) in &seen {
            if let Some(clash) = Clash::find(keys, q, &p) {
                return Err(format!(
                    "{} {first:?} and {t:?} {}; {}",
                    keys.two,
                    clash.rendered(),
                    clash.consequence(keys)
                ));
            }
        }
        seen.push((t, p.clone()));
        out.insert(p, v);
    }
    Ok(out)
}

/// The keys of the checker's `files` table (a `file_state` checker's paths), each located
/// at its first occurrence in the checker's table (written in quotes, or bare), in file
/// order.
fn checker_file_keys(src: &str, raw: &RawPack) -> Vec<(Range<usize>, String)> {
    let span = raw.checker.span();
    let Some(files) = raw
        .checker
        .get_ref()
        .get("files")
        .and_then(|f| f.as_table())
    else {
        return Vec::new();
    };
    let mut keys: Vec<(Range<usize>, String)> = files
        .keys()
        .map(|k| {
            let quoted = narrow(src, &span, &format!("{k:?}"));
            let at = if quoted != span {
                quoted
            } else {
                narrow(src, &span, k)
            };
            (at, k.clone())
        })
        .collect();
    keys.sort_by_key(|(at, _)| at.start);
    keys
}

/// Every path of `paths` (templates in file order, located), rendered as instances render
/// it, must be one the sandbox accepts, and no two may [`Clash`] (render to the same path,
/// or `[files]` paths one of which is a folder of the other) with any values validation
/// tries: an instance refuses either, so every episode that draws it is lost (the sandbox
/// refuses a `[files]` path itself, the workspace as a whole).
fn check_path_keys(
    d: &mut Diags<'_>,
    raw: &RawPack,
    declared: &BTreeSet<&str>,
    keys: &PathKeys,
    paths: &[(Range<usize>, String)],
) {
    let rules = format!(
        "relative to the workspace: no leading '/', no empty, '.' or '..' component, no control or bidi-override characters, at most {} bytes",
        corvid_sandbox::limits::MAX_PATH_BYTES
    );
    for (at, t) in paths {
        let Some(bad) = first_bad_rendering(raw, declared, &[t], |r| {
            workspace_path_problem(&r[0]).map_or(Ok(()), |why| Err(why.to_string()))
        }) else {
            continue;
        };
        // The template itself is wrong if it is wrong whatever its variables hold.
        let shape = placeholders(t)
            .unwrap_or_default()
            .iter()
            .fold(t.clone(), |s, n| s.replace(&format!("{{{n}}}"), "x"));
        if bad.vars.is_empty() || workspace_path_problem(&shape).is_some() {
            d.push(
                at.clone(),
                format!(
                    "{} {t:?} is not a valid workspace path: {}; {}, so no instance can start",
                    keys.one, bad.reason, keys.refused
                ),
                format!("\"{}\" = … ({rules})", clean_workspace_path(t)),
            );
        } else {
            d.push(
                at.clone(),
                format!(
                    "{} {t:?} renders to {:?} with {}, which is not a valid workspace path: {}; instances that draw it cannot start ({} of {} renderings checked fail)",
                    keys.one,
                    bad.rendered,
                    bad.vars(),
                    bad.reason,
                    bad.failed,
                    bad.checked
                ),
                format!(
                    "values of {} that keep every rendering {rules}, e.g. choices = [\"data\", \"logs\"]",
                    bad.names()
                ),
            );
        }
    }
    for (i, (_, first)) in paths.iter().enumerate() {
        for (at, second) in &paths[i + 1..] {
            let Some(bad) = first_bad_rendering(raw, declared, &[first, second], |r| {
                Clash::find(keys, &r[0], &r[1]).map_or(Ok(()), Err)
            }) else {
                continue;
            };
            // Two fixed paths can only nest (TOML refuses a key written twice).
            let (with, who) = if bad.vars.is_empty() {
                (String::new(), "no instance can start".to_string())
            } else {
                (
                    format!(" with {}", bad.vars()),
                    format!(
                        "instances that draw these values cannot start ({} of {} renderings checked collide)",
                        bad.failed, bad.checked
                    ),
                )
            };
            let hint = match &bad.reason {
                Clash::Same(_) => format!(
                    "paths that differ for every value of {}, e.g. each with a fixed part of its own: \"in/{{a}}.txt\" and \"out/{{b}}.txt\"",
                    bad.names()
                ),
                Clash::Nested(_) if bad.vars.is_empty() => {
                    "paths none of which is the folder of another, e.g. \"a.txt\" and \"a/b.txt\" rather than \"a.txt/b.txt\"".to_string()
                }
                Clash::Nested(_) => format!(
                    "paths none of which is the folder of another for any value of {}, e.g. each under a fixed folder of its own: \"in/{{a}}\" and \"out/{{b}}/c.txt\"",
                    bad.names()
                ),
            };
            d.push(
                at.clone(),
                format!(
                    "{} {first:?} and {second:?} {}{with}; {}, so {who}",
                    keys.two,
                    bad.reason.rendered(),
                    bad.reason.consequence(keys),
                ),
                hint,
            );
        }
    }
}

/// A regex checker's pattern must compile for every value its variables can take.
fn check_regex_renderings(d: &mut Diags<'_>, raw: &RawPack, declared: &BTreeSet<&str>) {
    let Some(t) = raw
        .checker
        .get_ref()
        .get("pattern")
        .and_then(|p| p.as_str())
    else {
        return;
    };
    let compile = |p: &str| {
        Checker::Regex {
            pattern: p.to_string(),
        }
        .validate()
        .map_err(|e| match e {
            TasksError::InvalidRegex { message, .. } => message,
            other => other.to_string(),
        })
    };
    let Some(bad) = first_bad_rendering(raw, declared, &[t], |r| compile(&r[0])) else {
        return;
    };
    let at = narrow(d.src, &raw.checker.span(), "pattern");
    if bad.vars.is_empty() {
        d.push(
            at,
            format!("checker regex {t:?} does not compile: {}", bad.reason),
            "a pattern the regex crate accepts (it is anchored as ^(?:PATTERN)$)",
        );
    } else {
        d.push(
            at,
            format!(
                "checker regex {t:?} does not compile with {} (pattern {:?}; {} of {} renderings checked fail): {}",
                bad.vars(),
                bad.rendered,
                bad.failed,
                bad.checked,
                bad.reason
            ),
            format!(
                "values of {} that are valid inside the pattern (escape regex metacharacters, e.g. \"\\\\(\" for a literal '('), or kind = \"exact\"",
                bad.names()
            ),
        );
    }
}

/// A `command_exit` checker's command must be one the `shell` tool runs, for every value
/// its variables can take: a command the toolbox shell does not have exits 127 and a line
/// it cannot parse exits 2, whatever the episode did, so the checker could not judge.
fn check_command_renderings(d: &mut Diags<'_>, raw: &RawPack, declared: &BTreeSet<&str>) {
    let Some(t) = raw
        .checker
        .get_ref()
        .get("command")
        .and_then(|c| c.as_str())
    else {
        return;
    };
    let Some(bad) = first_bad_rendering(raw, declared, &[t], |r| check_shell_line(&r[0])) else {
        return;
    };
    let at = narrow_key(d.src, &raw.checker.span(), "command");
    let hint = match &bad.reason {
        ShellLineProblem::UnknownCommand(_) => format!(
            "a command line using the toolbox shell's commands: {}",
            Checker::SHELL_COMMANDS.join(" ")
        ),
        ShellLineProblem::Syntax(_) => "a command line the toolbox shell parses: words, quotes, pipes |, lists ; && ||, redirects > >> < 2> 2>&1 (no subshells, backquotes or `&`)".to_string(),
        ShellLineProblem::Refused(_) => format!(
            "a command line of at most {} bytes, without NUL bytes",
            corvid_sandbox::limits::MAX_COMMAND_BYTES
        ),
    };
    if bad.vars.is_empty() || bad.failed == bad.checked {
        // No value of the variables helps: the command itself is wrong.
        d.push(
            at,
            format!(
                "checker command {t:?} cannot judge any episode: {}",
                bad.reason
            ),
            hint,
        );
    } else {
        d.push(
            at,
            format!(
                "checker command {t:?} renders to {:?} with {}, which cannot judge an episode: {} ({} of {} renderings checked fail)",
                bad.rendered,
                bad.vars(),
                bad.reason,
                bad.failed,
                bad.checked
            ),
            format!("values of {} that keep the command valid; {hint}", bad.names()),
        );
    }
}

/// A `wasi` checker's module must be a file the sandbox can load, as a custom tool's must
/// (relative to the pack file, present, not too big, a wasm binary), for every value its
/// variables can take: otherwise every check fails, whatever the episode did.
fn check_wasi_module(d: &mut Diags<'_>, raw: &RawPack, declared: &BTreeSet<&str>) {
    let Some(t) = raw.checker.get_ref().get("module").and_then(|m| m.as_str()) else {
        return;
    };
    let file = d.file;
    let hint = "module = \"wasm/check.wasm\" (a WASI preview-1 command that exits 0 to accept, relative to the pack file)";
    let Some(bad) = first_bad_rendering(raw, declared, &[t], |r| {
        module_problem(file, &r[0], hint).map_or(Ok(()), Err)
    }) else {
        return;
    };
    let at = narrow_key(d.src, &raw.checker.span(), "module");
    if bad.vars.is_empty() {
        d.push(
            at,
            format!(
                "wasi checker: {}, so every episode would fail its check",
                bad.reason.message
            ),
            bad.reason.hint,
        );
    } else {
        d.push(
            at,
            format!(
                "wasi checker module {t:?} renders to {:?} with {}: {}, so episodes that draw it would fail their check ({} of {} renderings checked fail)",
                bad.rendered,
                bad.vars(),
                bad.reason.message,
                bad.failed,
                bad.checked
            ),
            format!("values of {} that name a module; {}", bad.names(), bad.reason.hint),
        );
    }
}

impl TaskPack {
    /// Parses and validates pack text; `file` names it in diagnostics.
    pub fn parse(file: &str, src: &str) -> Result<Self, TasksError> {
        let mut d = Diags {
            file,
            src,
            out: Vec::new(),
        };
        let raw: RawPack = match toml::from_str(src) {
            Ok(r) => r,
            Err(e) => {
                let span = e.span().unwrap_or(0..0);
                let msg = e.message().trim().to_string();
                let hint = if msg.contains("unknown field") {
                    "remove the key or fix its spelling (see docs/tasks.md for the fields)"
                } else if msg.contains("missing field") {
                    "add the missing key (see docs/tasks.md for a complete pack)"
                } else if msg.contains("invalid type") {
                    "use the type the message names, e.g. a number without quotes"
                } else {
                    "valid TOML: `key = value`, strings in quotes, tables as [name]"
                };
                d.push(span, msg, hint);
                return Err(TasksError::Pack(d.out));
            }
        };
        Self::validate(&mut d, &raw);
        d.out.sort_by_key(|e| (e.line, e.column));
        if d.out.is_empty() {
            Ok(Self {
                file: file.to_string(),
                raw,
            })
        } else {
            Err(TasksError::Pack(d.out))
        }
    }

    fn validate(d: &mut Diags<'_>, raw: &RawPack) {
        // Name.
        let name = raw.pack.name.get_ref();
        let ok_name = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !ok_name || crate::families::builtin_names().contains(name) {
            d.push(
                raw.pack.name.span(),
                format!("pack name {name:?} must be lowercase letters, digits and '-', and not a built-in family"),
                "name = \"my-pack\"",
            );
        }
        // Variables.
        for (n, v) in &raw.vars {
            check_var(d, n, v);
        }
        let declared: BTreeSet<&str> = raw.vars.keys().map(String::as_str).collect();
        // Tools.
        for (t, lim) in raw.tools.get_ref() {
            if !KNOWN_TOOLS.contains(&t.as_str()) && !raw.custom_tools.contains_key(t) {
                d.push(
                    lim.span(),
                    format!("unknown tool `{t}`"),
                    format!(
                        "one of {}, or declare it under [custom_tools.{t}]",
                        KNOWN_TOOLS.join(", ")
                    ),
                );
            }
        }
        for (n, c) in &raw.custom_tools {
            check_custom_tool(d, n, c, raw.tools.get_ref().contains_key(n));
        }
        if !raw.tools.get_ref().contains_key("answer") {
            d.push(
                raw.tools.span(),
                "the tools do not include `answer`",
                "answer = {}",
            );
        }
        // Levels.
        let levels = raw.levels.get_ref();
        if levels.is_empty() {
            d.push(
                raw.levels.span(),
                "a pack needs at least one level",
                "[[levels]]\nlevel = 1\nmax_turns = 4\ncontext_budget = 2048",
            );
        }
        let min_turns = raw.oracle.get_ref().calls.len() as u32 + 1;
        for (i, l) in levels.iter().enumerate() {
            let l = l.get_ref();
            let want = i as u32 + 1;
            if *l.level.get_ref() != want {
                d.push(
                    l.level.span(),
                    format!(
                        "level {} is out of order (levels are numbered 1, 2, … in order)",
                        l.level.get_ref()
                    ),
                    format!("level = {want}"),
                );
            }
            if *l.max_turns.get_ref() < min_turns {
                d.push(
                    l.max_turns.span(),
                    format!(
                        "max_turns {} is below the oracle's {} calls plus the answer",
                        l.max_turns.get_ref(),
                        min_turns - 1
                    ),
                    format!("max_turns = {min_turns}"),
                );
            }
            if *l.context_budget.get_ref() < 256 {
                d.push(
                    l.context_budget.span(),
                    "context_budget below 256 tokens",
                    "context_budget = 2048",
                );
            }
            for (n, v) in &l.vars {
                if !declared.contains(n.as_str()) {
                    d.push(
                        v.span(),
                        format!("level overrides undeclared variable `{n}`"),
                        format!("declare it under [vars]: {n} = {{ min = 1, max = 9 }}"),
                    );
                }
                check_var(d, n, v);
            }
        }
        // Templates.
        let mut templates: Vec<(Range<usize>, String)> =
            vec![(raw.prompt.span(), raw.prompt.get_ref().clone())];
        for (p, c) in &raw.files {
            templates.push((p.span(), p.get_ref().clone()));
            templates.push((c.span(), c.get_ref().clone()));
        }
        let mut s = Vec::new();
        strings(raw.checker.get_ref(), &mut s);
        templates.extend(s.into_iter().map(|x| (raw.checker.span(), x)));
        // A file_state checker's paths are templates too.
        let checker_paths = checker_file_keys(d.src, raw);
        templates.extend(checker_paths.iter().cloned());
        for r in &raw.process_rewards {
            let mut s = Vec::new();
            strings(r.get_ref(), &mut s);
            templates.extend(s.into_iter().map(|x| (r.span(), x)));
        }
        let oracle = raw.oracle.get_ref();
        templates.push((oracle.answer.span(), oracle.answer.get_ref().clone()));
        for c in &oracle.calls {
            let mut s = Vec::new();
            strings(&toml::Value::Table(c.get_ref().args.clone()), &mut s);
            templates.extend(s.into_iter().map(|x| (c.span(), x)));
        }
        for (span, t) in &templates {
            match placeholders(t) {
                Err(_) => d.push(
                    span.clone(),
                    format!("unclosed `{{` in {t:?}"),
                    "close it: `{name}`, or remove the brace",
                ),
                Ok(names) => {
                    for n in names {
                        if !declared.contains(n.as_str()) {
                            d.push(
                                narrow(d.src, span, &format!("{{{n}}}")),
                                format!("template uses undeclared variable `{{{n}}}`"),
                                format!("declare it under [vars]: {n} = {{ min = 1, max = 9 }}"),
                            );
                        }
                    }
                }
            }
        }
        // Checker and rules, rendered with sample values.
        let sample: BTreeMap<String, String> = raw
            .vars
            .iter()
            .map(|(n, v)| {
                let v = v.get_ref();
                let x = v
                    .min
                    .map(|m| m.to_string())
                    .or_else(|| v.choices.as_ref().and_then(|c| c.first().cloned()));
                (n.clone(), x.unwrap_or_default())
            })
            .collect();
        match render_value(raw.checker.get_ref(), &sample).try_into::<Checker>() {
            Err(e) => d.push(
                raw.checker.span(),
                format!("invalid checker: {}", e.message().trim()),
                "kind = \"exact\" | \"regex\" | \"numeric\" | \"file_state\" | \"command_exit\" | \"wasi\" with its fields (docs/tasks.md)",
            ),
            // A regex is compiled only when an episode is checked, where a pattern that does
            // not compile reads as the policy's failure: compile it for the values instances
            // can draw, not just the sample.
            Ok(Checker::Regex { .. }) => check_regex_renderings(d, raw, &declared),
            // Its paths are rendered per instance like the `[files]` paths, under the same
            // rules.
            Ok(Checker::FileState { .. }) => {
                check_path_keys(d, raw, &declared, &FILE_STATE, &checker_paths)
            }
            // Both run in the sandbox when an episode is checked, where a command or module
            // that cannot run reads as the policy's failure.
            Ok(Checker::CommandExit { .. }) => check_command_renderings(d, raw, &declared),
            Ok(Checker::Wasi { .. }) => check_wasi_module(d, raw, &declared),
            Ok(c) => {
                if let Err(e) = c.validate() {
                    d.push(
                        raw.checker.span(),
                        e.to_string(),
                        "tolerance = 0.5 (a finite number >= 0) and a finite expected value",
                    );
                }
            }
        }
        let mut file_paths: Vec<(Range<usize>, String)> = raw
            .files
            .keys()
            .map(|p| (p.span(), p.get_ref().clone()))
            .collect();
        file_paths.sort_by_key(|(at, _)| at.start);
        check_path_keys(d, raw, &declared, &FILES, &file_paths);
        for r in &raw.process_rewards {
            match render_value(r.get_ref(), &sample).try_into::<ProcessRule>() {
                Err(e) => d.push(
                    r.span(),
                    format!("invalid process reward: {}", e.message().trim()),
                    "kind = \"reads_needed\" | \"searches_for\" | \"invalid_call\" | \"repeat_call\" with its fields",
                ),
                Ok(rule) => {
                    if let Some(why) = rule.weight_problem() {
                        let (key, w) = rule.weight();
                        let kind = r.get_ref().get("kind").and_then(|k| k.as_str()).unwrap_or("");
                        let sign = if key == "reward" { "adds" } else { "subtracts" };
                        d.push(
                            narrow_key(d.src, &r.span(), key),
                            format!("process reward `{kind}`: {key} = {w} {why}"),
                            format!(
                                "{key} = 0.1 (a finite number in 0..={}; the rule {sign} it, 0 turns it off)",
                                ProcessRule::MAX_WEIGHT
                            ),
                        );
                    }
                }
            }
        }
        // Oracle calls use allowed tools.
        for c in &oracle.calls {
            let t = c.get_ref().tool.get_ref();
            if t == "answer" {
                d.push(
                    c.get_ref().tool.span(),
                    "the oracle's answer goes in `oracle.answer`, not in a call",
                    "answer = \"{var}\" under [oracle]",
                );
            } else if !raw.tools.get_ref().contains_key(t) {
                let allowed: Vec<&str> = raw.tools.get_ref().keys().map(String::as_str).collect();
                let exists = KNOWN_TOOLS.contains(&t.as_str()) || raw.custom_tools.contains_key(t);
                // A tool that exists can be allowed; a name that does not is a typo of one.
                let hint = if exists {
                    format!("add `{t} = {{}}` under [tools], or call an allowed tool")
                } else {
                    let near = KNOWN_TOOLS
                        .iter()
                        .copied()
                        .chain(raw.custom_tools.keys().map(String::as_str))
                        .find(|k| looks_like(k, t))
                        .map(|k| format!("\"{k}\", or "))
                        .unwrap_or_default();
                    format!(
                        "tool = {near}one of the allowed tools: {}",
                        allowed.join(", ")
                    )
                };
                d.push(
                    c.get_ref().tool.span(),
                    format!("oracle calls `{t}`, which the pack's [tools] do not allow"),
                    hint,
                );
            }
        }
    }

    /// The pack's file, as given to [`TaskPack::parse`].
    pub fn file(&self) -> &str {
        &self.file
    }
}

/// Whether the tool name `typed` looks like a typo of `name`: the same letters up to case,
/// `_` and `-` (`writefile`, `Write-File`), or one letter added, dropped or changed (`shel`).
fn looks_like(name: &str, typed: &str) -> bool {
    let letters = |s: &str| -> Vec<char> {
        s.chars()
            .filter(|c| !matches!(c, '_' | '-'))
            .map(|c| c.to_ascii_lowercase())
            .collect()
    };
    let (a, b) = (letters(name), letters(typed));
    let (short, long) = if a.len() <= b.len() {
        (&a, &b)
    } else {
        (&b, &a)
    };
    match long.len() - short.len() {
        // Equal, or one letter changed.
        0 => a.iter().zip(&b).filter(|(x, y)| x != y).count() <= 1,
        // One letter added or dropped: the rest matches around it.
        1 => {
            let i = short
                .iter()
                .zip(long.iter())
                .take_while(|(x, y)| x == y)
                .count();
            short[i..] == long[i + 1..]
        }
        _ => false,
    }
}

/// Reads and validates the pack at `path`.
pub fn load_pack(path: &std::path::Path) -> Result<TaskPack, TasksError> {
    let src = std::fs::read_to_string(path).map_err(|e| TasksError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    TaskPack::parse(&path.display().to_string(), &src)
}

impl TaskFamily for TaskPack {
    fn name(&self) -> &str {
        self.raw.pack.name.get_ref()
    }

    fn description(&self) -> &str {
        &self.raw.pack.description
    }

    fn levels(&self) -> u32 {
        self.raw.levels.get_ref().len() as u32
    }

    fn instance(&self, level: u32, seed: u64) -> Result<TaskInstance, TasksError> {
        check_level(self.name(), level, self.levels())?;
        let lv = self.raw.levels.get_ref()[level as usize - 1].get_ref();
        let mut rng = SplitMix64::derive(seed, &format!("pack/{}/{level}", self.name()));
        let mut vars = BTreeMap::new();
        for (n, v) in &self.raw.vars {
            let v = lv.vars.get(n).unwrap_or(v).get_ref();
            let x = match (&v.choices, v.min, v.max) {
                (Some(c), _, _) => rng.pick(c).clone(),
                (None, Some(lo), Some(hi)) => rng.range(lo, hi).to_string(),
                _ => String::new(),
            };
            vars.insert(n.clone(), x);
        }
        let bad = |what: &str, e: toml::de::Error| TasksError::InvalidConfig {
            field: format!("{}.{what}", self.name()),
            value: e.message().to_string(),
            expected: "a value that validates".into(),
        };
        let id = format!("{}/L{level}/s{seed}", self.name());
        // Errors that only some values cause (validation cannot try every combination).
        let refused = |message: String| TasksError::PackInstance {
            file: self.file.clone(),
            instance: id.clone(),
            vars: vars
                .iter()
                .map(|(n, v)| format!("{n} = {v:?}"))
                .collect::<Vec<_>>()
                .join(", "),
            message,
        };
        let files = render_paths(
            &FILES,
            self.raw
                .files
                .iter()
                .map(|(p, c)| (p.get_ref().clone(), render(c.get_ref(), &vars).into_bytes())),
            &vars,
        )
        .map_err(refused)?;
        let mut checker: Checker = render_value(self.raw.checker.get_ref(), &vars)
            .try_into()
            .map_err(|e| bad("checker", e))?;
        // A checker that cannot judge (a regex that does not compile with this instance's
        // values, a command the shell does not have, a path no workspace holds) is a
        // broken instance, not a failed episode.
        checker.validate().map_err(|e| refused(e.to_string()))?;
        if let Checker::FileState { files } = &mut checker {
            // `render_value` renders values only; the paths are the table's keys.
            *files = render_paths(&FILE_STATE, std::mem::take(files), &vars).map_err(refused)?;
        }
        if let Checker::Wasi { module, .. } = &mut checker {
            // The module path is written relative to the pack file.
            let dir = std::path::Path::new(&self.file)
                .parent()
                .unwrap_or(std::path::Path::new(""));
            *module = dir.join(&*module).display().to_string();
        }
        let process_rules = self
            .raw
            .process_rewards
            .iter()
            .map(|r| {
                let rule = render_value(r.get_ref(), &vars)
                    .try_into::<ProcessRule>()
                    .map_err(|e| bad("process_rewards", e))?;
                rule.validate()?;
                Ok(rule)
            })
            .collect::<Result<Vec<_>, TasksError>>()?;
        let oracle = self.raw.oracle.get_ref();
        let mut plan = PlanBuilder::new(&files, &[]);
        for c in &oracle.calls {
            let args = toml::Value::Table(c.get_ref().args.clone());
            let json = serde_json::to_value(render_value(&args, &vars)).unwrap_or_default();
            let tool = c.get_ref().tool.get_ref();
            if self.raw.custom_tools.contains_key(tool) {
                plan.external(tool, json);
            } else {
                plan.call(tool, json);
            }
        }
        let pack_dir = std::path::Path::new(&self.file)
            .parent()
            .unwrap_or(std::path::Path::new(""));
        let custom_tools = self
            .raw
            .custom_tools
            .iter()
            .map(|(n, c)| {
                let c = c.get_ref();
                CustomToolDecl {
                    name: n.clone(),
                    description: c.description.get_ref().clone(),
                    module: pack_dir.join(c.module.get_ref()).display().to_string(),
                    limits: c.limits(),
                    workspace_writable: c.workspace_writable,
                }
            })
            .collect();
        let tools = self
            .raw
            .tools
            .get_ref()
            .iter()
            .map(|(n, l)| ToolSpec {
                name: n.clone(),
                limits: l.get_ref().clone(),
            })
            .collect();
        let inst = TaskInstance {
            id,
            family: self.name().to_string(),
            level,
            seed,
            prompt: render(self.raw.prompt.get_ref(), &vars),
            files,
            read_only: ReadOnlyData::default(),
            tools,
            max_turns: *lv.max_turns.get_ref(),
            context_budget: *lv.context_budget.get_ref(),
            checker,
            process_rules,
            oracle: OraclePlan {
                steps: plan.finish(),
                answer: render(oracle.answer.get_ref(), &vars),
            },
            custom_tools,
            spec_hash: String::new(),
        };
        Ok(inst.seal())
    }
}
