//! `search`: retrieval QA over a fictional corpus generated from the seed. Each entity's
//! document names its *liaison*, another entity; a question of level `L` follows the
//! liaison chain for [`CHAIN_CALLS`]`[L−1]` searches and asks the founding year of the
//! entity it reaches.

use serde_json::json;

use super::{budget_for, filler, PlanBuilder, CHAIN_CALLS, RECOVERY_FROM};
use crate::checker::Checker;
use crate::error::TasksError;
use crate::process::ProcessRule;
use crate::rng::SplitMix64;
use crate::task::{
    check_level, Document, OraclePlan, ReadOnlyData, TaskFamily, TaskInstance, ToolSpec,
};

/// Filler bytes per document, by level.
const FILLER: [usize; 8] = [0, 20, 40, 60, 80, 100, 120, 120];
/// Documents outside the chain, by level.
const EXTRA_DOCS: [usize; 8] = [4, 6, 8, 10, 14, 18, 24, 30];
/// Results per search, by level (one at level 1 keeps it near 200 tokens).
const TOP_K: [u64; 8] = [1, 2, 3, 3, 3, 3, 3, 3];

const SYLLABLES: [&str; 16] = [
    "ka", "lo", "ver", "mi", "zan", "tor", "el", "qui", "ra", "dun", "sel", "bo", "fen", "ys",
    "mar", "tho",
];
const KINDS: [&str; 5] = ["guild", "observatory", "shipyard", "archive", "orchard"];

/// A capitalised pseudo-name of two words, e.g. `Kalo Vertor`.
fn name(rng: &mut SplitMix64) -> String {
    let mut word = || {
        let n = rng.range(2, 3);
        let w: String = (0..n).map(|_| *rng.pick(&SYLLABLES)).collect();
        let mut c = w.chars();
        c.next()
            .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
            .unwrap_or_default()
    };
    format!("{} {}", word(), word())
}

/// The `search` family.
#[derive(Debug, Clone, Copy, Default)]
pub struct Search;

impl Search {
    /// The corpus of an instance, without generating the rest of it (for building the
    /// sandbox's index ahead of time).
    pub fn corpus(level: u32, seed: u64) -> Result<Vec<Document>, TasksError> {
        Ok(Search.instance(level, seed)?.read_only.corpus)
    }
}

impl TaskFamily for Search {
    fn name(&self) -> &str {
        "search"
    }

    fn description(&self) -> &str {
        "multi-hop retrieval QA over a generated corpus of fictional entities (BM25 `search`)"
    }

    fn levels(&self) -> u32 {
        CHAIN_CALLS.len() as u32
    }

    fn instance(&self, level: u32, seed: u64) -> Result<TaskInstance, TasksError> {
        check_level(self.name(), level, self.levels())?;
        let li = level as usize - 1;
        let hops = CHAIN_CALLS[li];
        let mut rng = SplitMix64::derive(seed, &format!("search/{level}"));
        let total = hops + EXTRA_DOCS[li];
        let mut names: Vec<String> = Vec::new();
        while names.len() < total {
            let n = name(&mut rng);
            // Unique, and no name a prefix-word-subset of another keeps titles exact.
            if !names.contains(&n) {
                names.push(n);
            }
        }
        let mut years: Vec<i64> = Vec::new();
        while years.len() < total {
            let y = rng.range(1200, 1999);
            if !years.contains(&y) {
                years.push(y);
            }
        }
        // Entities 0..hops form the chain; the others point at random entities.
        let mut corpus: Vec<Document> = Vec::with_capacity(total);
        for i in 0..total {
            let liaison = if i + 1 < hops {
                i + 1
            } else {
                let mut j = rng.below(total as u64) as usize;
                if j == i {
                    j = (j + 1) % total;
                }
                j
            };
            let kind = rng.pick(&KINDS);
            let extra = filler(&mut rng, FILLER[li]).join(" ");
            let mut text = format!(
                "{} is {} {kind}. It was founded in {}. Its liaison is {}.",
                names[i],
                if kind.starts_with(['a', 'e', 'i', 'o', 'u']) {
                    "an"
                } else {
                    "a"
                },
                years[i],
                names[liaison]
            );
            if !extra.is_empty() {
                text.push(' ');
                text.push_str(&extra);
                text.push('.');
            }
            corpus.push(Document {
                id: String::new(),
                title: names[i].clone(),
                text,
            });
        }
        rng.shuffle(&mut corpus);
        for (i, d) in corpus.iter_mut().enumerate() {
            d.id = format!("doc-{i:04}");
        }
        let target_year = years[hops - 1];
        let prompt = if hops == 1 {
            format!(
                "In which year was {} founded? Use the search tool, then call answer with the year.",
                names[0]
            )
        } else {
            format!(
                "Start with {}. Look up its liaison, then that entity's liaison, and so on: {} \
                 liaison step(s) in all. In which year was the entity you reach founded? Use the \
                 search tool, then call answer with the year.",
                names[0],
                hops - 1
            )
        };
        let files = Default::default();
        let mut plan = PlanBuilder::new(&files, &corpus);
        for (i, n) in names.iter().take(hops).enumerate() {
            if level >= RECOVERY_FROM && i == 1 {
                // Recoverable failure: a misnamed argument, then the fix.
                plan.call("search", json!({"q": n}));
            }
            plan.call("search", json!({"query": n, "k": TOP_K[li]}));
        }
        let steps = plan.finish();
        let mut inst = TaskInstance {
            id: format!("search/L{level}/s{seed}"),
            family: "search".into(),
            level,
            seed,
            prompt,
            files,
            read_only: ReadOnlyData { corpus },
            tools: vec![
                ToolSpec::limited("search", 2 * hops as u32 + 4, Some(4096)),
                ToolSpec::unlimited("answer"),
            ],
            max_turns: hops as u32 + 4,
            context_budget: 0,
            checker: Checker::Exact {
                expected: target_year.to_string(),
                case_insensitive: false,
            },
            process_rules: vec![
                ProcessRule::SearchesFor {
                    terms: names[..hops].to_vec(),
                    reward: 0.1,
                },
                ProcessRule::InvalidCall { penalty: 0.1 },
                ProcessRule::RepeatCall { penalty: 0.05 },
            ],
            oracle: OraclePlan {
                steps,
                answer: target_year.to_string(),
            },
            custom_tools: Vec::new(),
            python: Default::default(),
            spec_hash: String::new(),
        };
        inst.context_budget = budget_for(inst.oracle_tokens());
        Ok(inst.seal())
    }
}
