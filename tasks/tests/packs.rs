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
