//! `pyfix`: a small Python module with one bug, and its unit tests. The policy runs the
//! tests, reads the module, fixes the function and runs the tests again; the checker runs
//! the original tests in the sandbox over the final workspace (editing the tests does not
//! help). Levels raise the module's size (1 to 12 functions) and the distance between the
//! failing test and the bug: from level 5 the tested function hands its work to a helper
//! (two helpers deep from level 7), defined at the end of the module, where the bug is.
//!
//! The oracle runs the tests (they fail), reads the module, writes it fixed and runs the
//! tests again; from [`RECOVERY_FROM`] it first reads the module without its `.py`. Only the
//! real sandbox runs Python, so the tests' output is known only there.

use std::collections::BTreeMap;

use serde_json::json;

use corvid_proto::ToolStatus;

use super::{budget_for, PlanBuilder, RECOVERY_FROM};
use crate::checker::Checker;
use crate::error::TasksError;
use crate::process::ProcessRule;
use crate::rng::SplitMix64;
use crate::task::{check_level, OraclePlan, ReadOnlyData, TaskFamily, TaskInstance, ToolSpec};

/// Functions in the module, by level.
const FUNCTIONS: [usize; 8] = [1, 2, 3, 4, 6, 8, 10, 12];
/// Module names an instance draws from.
const MODULES: [&str; 5] = ["calc", "utils", "stats", "textkit", "tools"];
/// Bytes of a failing unittest run's output (only the sandbox knows the text), for the
/// context budget.
const FAILING_RUN_BYTES: usize = 900;
/// Bytes of a passing run's output.
const PASSING_RUN_BYTES: usize = 120;

/// One function of the library: its signature, docstring, correct and buggy bodies (each
/// line indented by four spaces), and the test method's body (indented by eight).
struct Function {
    name: &'static str,
    params: &'static str,
    doc: &'static str,
    body: &'static str,
    buggy: &'static str,
    test: &'static str,
}

const LIBRARY: [Function; 12] = [
    Function {
        name: "clamp",
        params: "x, lo, hi",
        doc: "x limited to the range [lo, hi].",
        body: "    return max(lo, min(x, hi))\n",
        buggy: "    return min(lo, max(x, hi))\n",
        test: "        self.assertEqual(M.clamp(5, 0, 10), 5)\n        self.assertEqual(M.clamp(-3, 0, 10), 0)\n        self.assertEqual(M.clamp(12, 0, 10), 10)\n",
    },
    Function {
        name: "mean",
        params: "xs",
        doc: "The arithmetic mean of xs.",
        body: "    return sum(xs) / len(xs)\n",
        buggy: "    return sum(xs) / (len(xs) - 1)\n",
        test: "        self.assertEqual(M.mean([2, 4, 6]), 4)\n        self.assertEqual(M.mean([5]), 5)\n",
    },
    Function {
        name: "count_vowels",
        params: "s",
        doc: "How many letters of s are vowels, in either case.",
        body: "    return sum(1 for c in s.lower() if c in \"aeiou\")\n",
        buggy: "    return sum(1 for c in s if c in \"aeiou\")\n",
        test: "        self.assertEqual(M.count_vowels(\"Apple\"), 2)\n        self.assertEqual(M.count_vowels(\"xyz\"), 0)\n",
    },
    Function {
        name: "last_n",
        params: "xs, n",
        doc: "The last n items of xs (none when n <= 0).",
        body: "    return xs[len(xs) - n:] if n > 0 else []\n",
        buggy: "    return xs[len(xs) - n + 1:] if n > 0 else []\n",
        test: "        self.assertEqual(M.last_n([1, 2, 3, 4], 2), [3, 4])\n        self.assertEqual(M.last_n([1, 2], 0), [])\n",
    },
    Function {
        name: "is_leap",
        params: "year",
        doc: "Whether year is a leap year in the Gregorian calendar.",
        body: "    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)\n",
        buggy: "    return year % 4 == 0 and year % 100 != 0\n",
        test: "        self.assertTrue(M.is_leap(2024))\n        self.assertFalse(M.is_leap(1900))\n        self.assertTrue(M.is_leap(2000))\n",
    },
    Function {
        name: "dedupe",
        params: "xs",
        doc: "xs without repeats, in first-seen order.",
        body: "    seen = set()\n    out = []\n    for x in xs:\n        if x not in seen:\n            seen.add(x)\n            out.append(x)\n    return out\n",
        buggy: "    seen = set()\n    out = []\n    for x in xs:\n        if x not in seen:\n            seen.add(x)\n        out.append(x)\n    return out\n",
        test: "        self.assertEqual(M.dedupe([3, 1, 3, 2, 1]), [3, 1, 2])\n",
    },
    Function {
        name: "word_count",
        params: "text",
        doc: "How many whitespace-separated words text holds.",
        body: "    return len(text.split())\n",
        buggy: "    return len(text.split(\" \"))\n",
        test: "        self.assertEqual(M.word_count(\"a  b c\"), 3)\n        self.assertEqual(M.word_count(\"one\"), 1)\n",
    },
    Function {
        name: "total_price",
        params: "items",
        doc: "The total of (quantity, unit price) pairs.",
        body: "    return sum(q * p for q, p in items)\n",
        buggy: "    return sum(q + p for q, p in items)\n",
        test: "        self.assertEqual(M.total_price([(2, 3), (4, 5)]), 26)\n        self.assertEqual(M.total_price([]), 0)\n",
    },
    Function {
        name: "safe_div",
        params: "a, b",
        doc: "a / b, or 0.0 when b is 0.",
        body: "    return a / b if b != 0 else 0.0\n",
        buggy: "    return a / b if a != 0 else 0.0\n",
        test: "        self.assertEqual(M.safe_div(6, 3), 2)\n        self.assertEqual(M.safe_div(1, 0), 0.0)\n",
    },
    Function {
        name: "median",
        params: "xs",
        doc: "The middle value of xs (the mean of the two middle ones when len(xs) is even).",
        body: "    s = sorted(xs)\n    n = len(s)\n    if n % 2:\n        return s[n // 2]\n    return (s[n // 2 - 1] + s[n // 2]) / 2\n",
        buggy: "    s = list(xs)\n    n = len(s)\n    if n % 2:\n        return s[n // 2]\n    return (s[n // 2 - 1] + s[n // 2]) / 2\n",
        test: "        self.assertEqual(M.median([3, 1, 2]), 2)\n        self.assertEqual(M.median([4, 1, 3, 2]), 2.5)\n",
    },
    Function {
        name: "initials",
        params: "name",
        doc: "The capitalised first letters of name's words.",
        body: "    return \"\".join(w[0].upper() for w in name.split())\n",
        buggy: "    return \"\".join(w[0] for w in name.split())\n",
        test: "        self.assertEqual(M.initials(\"ada lovelace\"), \"AL\")\n",
    },
    Function {
        name: "running_total",
        params: "xs",
        doc: "The prefix sums of xs.",
        body: "    out, acc = [], 0\n    for x in xs:\n        acc += x\n        out.append(acc)\n    return out\n",
        buggy: "    out, acc = [], 0\n    for x in xs:\n        acc += x\n        out.append(x)\n    return out\n",
        test: "        self.assertEqual(M.running_total([1, 2, 3]), [1, 3, 6])\n",
    },
];

/// The `pyfix` family.
#[derive(Debug, Clone, Copy, Default)]
pub struct PyFix;

/// Helpers between the tested function and the bug, by level.
fn depth(level: u32) -> usize {
    match level {
        1..=4 => 0,
        5 | 6 => 1,
        _ => 2,
    }
}

/// The module's source: `functions` in order, `bug`'s body buggy unless `fixed`. With
/// `depth` > 0 each public function hands its arguments down a chain of `depth` helpers
/// (`_name_1`, …), defined after every public function, the last of which holds the body.
fn module_source(functions: &[&Function], bug: &str, depth: usize, fixed: bool) -> String {
    let mut public = Vec::new();
    let mut helpers = Vec::new();
    for f in functions {
        let body = if f.name == bug && !fixed {
            f.buggy
        } else {
            f.body
        };
        let (name, args, doc) = (f.name, f.params, f.doc);
        if depth == 0 {
            public.push(format!(
                "def {name}({args}):\n    \"\"\"{doc}\"\"\"\n{body}"
            ));
            continue;
        }
        public.push(format!(
            "def {name}({args}):\n    \"\"\"{doc}\"\"\"\n    return _{name}_1({args})\n"
        ));
        for d in 1..=depth {
            let inner = if d == depth {
                body.to_string()
            } else {
                format!("    return _{name}_{}({args})\n", d + 1)
            };
            helpers.push(format!("def _{name}_{d}({args}):\n{inner}"));
        }
    }
    public.extend(helpers);
    public.join("\n\n")
}

/// The test module for `functions`, importing the module `module` as `M`.
fn test_source(module: &str, functions: &[&Function]) -> String {
    format!(
        "import unittest\n\nimport {module} as M\n\n\n{}",
        test_class(functions)
    )
}

/// The test case class over `functions` (the module imported as `M`).
fn test_class(functions: &[&Function]) -> String {
    let mut s = String::from("class Test(unittest.TestCase):\n");
    for (i, f) in functions.iter().enumerate() {
        if i > 0 {
            s.push('\n');
        }
        s += &format!("    def test_{}(self):\n{}", f.name, f.test);
    }
    s
}

/// The checker: the original tests over the final module. A module that raises or exits
/// while imported fails, and so does a run where any test fails or fewer than all ran (a
/// test that calls `sys.exit` is an error, as unittest records it). A module that ends the
/// interpreter itself (`os._exit(0)`) while imported would pass: in-process checks cannot
/// rule that out.
fn checker_source(module: &str, functions: &[&Function]) -> String {
    format!(
        "import sys\nimport unittest\n\ntry:\n    import {module} as M\nexcept BaseException as e:\n    sys.exit(f\"importing {module} failed: {{e!r}}\")\n\n\n{}\n\n_result = unittest.main(argv=[\"check\"], exit=False, verbosity=0).result\nif not (_result.wasSuccessful() and _result.testsRun == {}):\n    sys.exit(f\"{{_result.testsRun}} of {} tests ran, {{len(_result.failures)}} failed, {{len(_result.errors)}} errors\")\n",
        test_class(functions),
        functions.len(),
        functions.len()
    )
}

impl TaskFamily for PyFix {
    fn name(&self) -> &str {
        "pyfix"
    }

    fn description(&self) -> &str {
        "fix the bug in a Python module until its unit tests pass; levels add functions and put the bug further from the failing test"
    }

    fn levels(&self) -> u32 {
        FUNCTIONS.len() as u32
    }

    fn instance(&self, level: u32, seed: u64) -> Result<TaskInstance, TasksError> {
        check_level(self.name(), level, self.levels())?;
        let mut rng = SplitMix64::derive(seed, &format!("pyfix/{level}"));
        let module = *rng.pick(&MODULES);
        let mut order: Vec<usize> = (0..LIBRARY.len()).collect();
        rng.shuffle(&mut order);
        let functions: Vec<&Function> = order[..FUNCTIONS[level as usize - 1]]
            .iter()
            .map(|&i| &LIBRARY[i])
            .collect();
        let bugged = functions[rng.below(functions.len() as u64) as usize].name;
        let d = depth(level);
        let module_file = format!("{module}.py");
        let test_file = format!("test_{module}.py");
        let tests = test_source(module, &functions);
        let broken = module_source(&functions, bugged, d, false);
        let fixed = module_source(&functions, bugged, d, true);
        let files = BTreeMap::from([
            (module_file.clone(), broken.into_bytes()),
            (
                test_file.clone(),
                format!("{tests}\n\nif __name__ == \"__main__\":\n    unittest.main()\n")
                    .into_bytes(),
            ),
        ]);

        let run_tests = json!({ "path": test_file });
        let mut plan = PlanBuilder::new(&files, &[]);
        plan.external(
            "python",
            run_tests.clone(),
            ToolStatus::ExitNonzero,
            String::new(),
        );
        if level >= RECOVERY_FROM {
            plan.call("read_file", json!({ "path": module }));
        }
        plan.call("read_file", json!({ "path": module_file }));
        plan.call(
            "write_file",
            json!({ "path": module_file, "content": fixed }),
        );
        plan.external("python", run_tests, ToolStatus::Ok, String::new());
        let steps = plan.finish();
        let calls = steps.len() as u32;
        let answer = "fixed".to_string();
        let inst = TaskInstance {
            id: format!("pyfix/L{level}/s{seed}"),
            family: self.name().into(),
            level,
            seed,
            prompt: format!(
                "The tests in {test_file} fail. Fix the bug in {module_file} so that they pass, then answer `fixed`."
            ),
            files,
            read_only: ReadOnlyData::default(),
            tools: vec![
                ToolSpec::limited("python", calls + 4, Some(4096)),
                ToolSpec::limited("read_file", calls + 4, Some(8192)),
                ToolSpec::limited("write_file", 4, None),
                ToolSpec::limited("shell", calls + 4, Some(4096)),
                ToolSpec::unlimited("answer"),
            ],
            max_turns: calls + 6,
            context_budget: 0,
            // The original tests, whatever the episode did to its copy; the checker's
            // arguments are not unittest's.
            checker: Checker::Python {
                code: Some(checker_source(module, &functions)),
                script: None,
                args: Vec::new(),
            },
            process_rules: ProcessRule::defaults(vec![module_file]),
            oracle: OraclePlan {
                steps,
                answer: answer.clone(),
            },
            custom_tools: Vec::new(),
            python: Default::default(),
            spec_hash: String::new(),
        };
        let budget = budget_for(inst.oracle_tokens() + FAILING_RUN_BYTES + PASSING_RUN_BYTES);
        Ok(TaskInstance {
            context_budget: budget,
            ..inst
        }
        .seal())
    }
}
