//! `pydata`: a question about a CSV file, answered by running a script. Levels raise the
//! data size (6 to 1,200 rows, past the 4,096 bytes `read_file` shows from level 6) and the
//! steps a script needs: count, then filter and sum, then join a second file, then group and
//! take the largest.
//!
//! The oracle looks at each file's first lines with the shell, runs one `python` program
//! that prints the answer, and answers it; from [`RECOVERY_FROM`] its first program names a
//! column the file does not have (a `KeyError` traceback), then the fix. Only the real
//! sandbox runs Python: the program's output is the answer the family computed, so the
//! oracle records it, but a traceback's text is known only from the sandbox.

use std::collections::BTreeMap;

use serde_json::json;

use corvid_proto::ToolStatus;

use super::{budget_for, PlanBuilder, RECOVERY_FROM};
use crate::checker::Checker;
use crate::error::TasksError;
use crate::process::ProcessRule;
use crate::rng::SplitMix64;
use crate::task::{check_level, OraclePlan, ReadOnlyData, TaskFamily, TaskInstance, ToolSpec};

/// Rows of `data/sales.csv`, by level.
const ROWS: [usize; 8] = [6, 12, 30, 60, 150, 300, 600, 1200];
/// The sales file.
const SALES: &str = "data/sales.csv";
/// The file mapping each region to its manager (levels 5–8).
const REGIONS: &str = "data/regions.csv";
/// Region names.
const REGION_NAMES: [&str; 8] = [
    "north", "south", "east", "west", "central", "coastal", "highland", "lowland",
];
/// Product names.
const PRODUCTS: [&str; 8] = [
    "widget", "gadget", "bolt", "gear", "valve", "spring", "lever", "pulley",
];
/// Managers' names.
const MANAGERS: [&str; 4] = ["Okafor", "Lindqvist", "Moreau", "Tanaka"];
/// Bytes of a traceback the oracle's recoverable mistake prints (only the sandbox knows the
/// text), for the context budget.
const TRACEBACK_BYTES: usize = 400;

/// The `pydata` family.
#[derive(Debug, Clone, Copy, Default)]
pub struct PyData;

/// One sale.
struct Row {
    region: &'static str,
    product: &'static str,
    units: i64,
    price: i64,
}

/// What the question asks, by level.
enum Question {
    /// Rows of a region.
    Count { region: &'static str },
    /// Units of a product in a region.
    Sum {
        region: &'static str,
        product: &'static str,
    },
    /// Revenue (units × price) of the regions a manager runs.
    Join { manager: &'static str },
    /// The product with the most revenue in the regions a manager runs.
    Top { manager: &'static str },
}

impl Question {
    /// The question for `level`, about the region and product of one of the `rows` (so a
    /// count or a sum is never zero by chance).
    fn for_level(level: u32, rng: &mut SplitMix64, rows: &[Row]) -> Self {
        let asked = &rows[rng.below(rows.len() as u64) as usize];
        match level {
            1 | 2 => Question::Count {
                region: asked.region,
            },
            3 | 4 => Question::Sum {
                region: asked.region,
                product: asked.product,
            },
            5 | 6 => Question::Join {
                manager: pick(rng, &MANAGERS),
            },
            _ => Question::Top {
                manager: pick(rng, &MANAGERS),
            },
        }
    }

    fn prompt(&self) -> String {
        let q = match self {
            Question::Count { region } => {
                format!("How many sales in {SALES} are from the region `{region}`?")
            }
            Question::Sum { region, product } => format!(
                "How many units of `{product}` were sold in the region `{region}`, according to {SALES}?"
            ),
            Question::Join { manager } => format!(
                "What is the total revenue (units times price) of the sales in {SALES} from the regions that {manager} manages ({REGIONS})?"
            ),
            Question::Top { manager } => format!(
                "Which product earned the most revenue (units times price) in the regions that {manager} manages? Sales are in {SALES}, managers in {REGIONS}."
            ),
        };
        format!("{q} Run a Python script over the data and answer with its result only.")
    }

    /// The program that prints the answer; `units` is the name it reads the units column by
    /// (the recoverable mistake misspells it).
    fn program(&self, units: &str) -> String {
        let managed = |m: &str| {
            format!(
                "managed = [r[\"region\"] for r in csv.DictReader(open(\"{REGIONS}\")) if r[\"manager\"] == \"{m}\"]\n"
            )
        };
        let rows = format!("rows = list(csv.DictReader(open(\"{SALES}\")))\n");
        match self {
            Question::Count { region } => format!(
                "import csv\n{rows}print(sum(1 for r in rows if r[\"region\"] == \"{region}\"))\n"
            ),
            Question::Sum { region, product } => format!(
                "import csv\n{rows}print(sum(int(r[\"{units}\"]) for r in rows if r[\"region\"] == \"{region}\" and r[\"product\"] == \"{product}\"))\n"
            ),
            Question::Join { manager } => format!(
                "import csv\n{}{rows}print(sum(int(r[\"{units}\"]) * int(r[\"price\"]) for r in rows if r[\"region\"] in managed))\n",
                managed(manager)
            ),
            Question::Top { manager } => format!(
                "import csv\nfrom collections import Counter\n{}revenue = Counter()\nfor r in csv.DictReader(open(\"{SALES}\")):\n    if r[\"region\"] in managed:\n        revenue[r[\"product\"]] += int(r[\"{units}\"]) * int(r[\"price\"])\nprint(revenue.most_common(1)[0][0])\n",
                managed(manager)
            ),
        }
    }

    fn needs_regions(&self) -> bool {
        matches!(self, Question::Join { .. } | Question::Top { .. })
    }
}

/// One of `names`, uniformly.
fn pick(rng: &mut SplitMix64, names: &[&'static str]) -> &'static str {
    names[rng.below(names.len() as u64) as usize]
}

/// Revenue by product over `rows` in `regions`.
fn revenue_by_product(rows: &[Row], regions: &[&str]) -> BTreeMap<&'static str, i64> {
    let mut out = BTreeMap::new();
    for r in rows.iter().filter(|r| regions.contains(&r.region)) {
        *out.entry(r.product).or_insert(0) += r.units * r.price;
    }
    out
}

/// The answer to `q` over `rows`, with `manager_of` each region's manager. A `Top` question
/// whose largest revenue is shared has no single answer: `None`.
fn answer(q: &Question, rows: &[Row], manager_of: &BTreeMap<&str, &str>) -> Option<String> {
    let managed = |m: &str| -> Vec<&str> {
        manager_of
            .iter()
            .filter(|(_, v)| **v == m)
            .map(|(k, _)| *k)
            .collect()
    };
    Some(match q {
        Question::Count { region } => rows
            .iter()
            .filter(|r| r.region == *region)
            .count()
            .to_string(),
        Question::Sum { region, product } => rows
            .iter()
            .filter(|r| r.region == *region && r.product == *product)
            .map(|r| r.units)
            .sum::<i64>()
            .to_string(),
        Question::Join { manager } => revenue_by_product(rows, &managed(manager))
            .values()
            .sum::<i64>()
            .to_string(),
        Question::Top { manager } => {
            let by = revenue_by_product(rows, &managed(manager));
            let best = by.values().copied().max()?;
            let mut top = by.iter().filter(|(_, v)| **v == best);
            let (product, _) = top.next()?;
            if top.next().is_some() {
                return None;
            }
            product.to_string()
        }
    })
}

impl TaskFamily for PyData {
    fn name(&self) -> &str {
        "pydata"
    }

    fn description(&self) -> &str {
        "answer a question about a CSV file by running a Python script; levels add rows and steps (count, filter and sum, join, group and rank)"
    }

    fn levels(&self) -> u32 {
        ROWS.len() as u32
    }

    fn instance(&self, level: u32, seed: u64) -> Result<TaskInstance, TasksError> {
        check_level(self.name(), level, self.levels())?;
        let mut rng = SplitMix64::derive(seed, &format!("pydata/{level}"));
        // Every manager runs two regions.
        let mut regions = REGION_NAMES;
        rng.shuffle(&mut regions);
        let manager_of: BTreeMap<&str, &str> = regions
            .iter()
            .enumerate()
            .map(|(i, r)| (*r, MANAGERS[i / 2]))
            .collect();
        let mut rows: Vec<Row> = (0..ROWS[level as usize - 1])
            .map(|_| Row {
                region: pick(&mut rng, &REGION_NAMES),
                product: pick(&mut rng, &PRODUCTS),
                units: rng.range(1, 40),
                price: rng.range(2, 99),
            })
            .collect();
        let q = Question::for_level(level, &mut rng, &rows);
        // A shared top revenue has no single answer: one more unit in a sale of the first
        // product sharing it makes that one lead.
        let expected = loop {
            if let Some(a) = answer(&q, &rows, &manager_of) {
                break a;
            }
            let Question::Top { manager } = &q else {
                unreachable!("only a Top question can tie")
            };
            let managed: Vec<&str> = manager_of
                .iter()
                .filter(|(_, m)| *m == manager)
                .map(|(r, _)| *r)
                .collect();
            let by = revenue_by_product(&rows, &managed);
            let best = by.values().copied().max().unwrap_or(0);
            let Some(row) = rows
                .iter_mut()
                .find(|r| managed.contains(&r.region) && by.get(r.product) == Some(&best))
            else {
                unreachable!("a tie is between products sold in the manager's regions")
            };
            row.units += 1;
        };
        let mut sales = String::from("id,region,product,units,price\n");
        for (i, r) in rows.iter().enumerate() {
            sales += &format!(
                "{},{},{},{},{}\n",
                i + 1,
                r.region,
                r.product,
                r.units,
                r.price
            );
        }
        let mut files = BTreeMap::from([(SALES.to_string(), sales.into_bytes())]);
        let mut needed = vec![SALES.to_string()];
        if q.needs_regions() {
            let mut text = String::from("region,manager\n");
            for (r, m) in &manager_of {
                text += &format!("{r},{m}\n");
            }
            files.insert(REGIONS.to_string(), text.into_bytes());
            needed.push(REGIONS.to_string());
        }

        let mut plan = PlanBuilder::new(&files, &[]);
        for path in &needed {
            plan.call("shell", json!({ "command": format!("head -n 3 {path}") }));
        }
        let mut budget_extra = 0;
        if level >= RECOVERY_FROM {
            plan.external(
                "python",
                json!({ "code": q.program("unit") }),
                ToolStatus::ExitNonzero,
                String::new(),
            );
            budget_extra += TRACEBACK_BYTES;
        }
        plan.external(
            "python",
            json!({ "code": q.program("units") }),
            ToolStatus::Ok,
            format!("{expected}\n"),
        );
        let steps = plan.finish();
        let calls = steps.len() as u32;
        let inst = TaskInstance {
            id: format!("pydata/L{level}/s{seed}"),
            family: self.name().into(),
            level,
            seed,
            prompt: q.prompt(),
            files,
            read_only: ReadOnlyData::default(),
            tools: vec![
                ToolSpec::limited("python", calls + 4, Some(4096)),
                ToolSpec::limited("shell", calls + 4, Some(4096)),
                ToolSpec::limited("read_file", 4, Some(4096)),
                ToolSpec::unlimited("answer"),
            ],
            max_turns: calls + 6,
            context_budget: 0,
            checker: Checker::Exact {
                expected: expected.clone(),
                case_insensitive: true,
            },
            process_rules: ProcessRule::defaults(needed),
            oracle: OraclePlan {
                steps,
                answer: expected,
            },
            custom_tools: Vec::new(),
            python: Default::default(),
            spec_hash: String::new(),
        };
        let budget = budget_for(inst.oracle_tokens() + budget_extra);
        Ok(TaskInstance {
            context_budget: budget,
            ..inst
        }
        .seal())
    }
}
