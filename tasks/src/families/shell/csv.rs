//! `csv`: CSV files under `data/` with the header `id,name,city,score,active`. For each
//! input the agent writes `<region>-<city>.csv` holding the `name,score` of the rows
//! whose city is the one asked, in the original order, without a header. The oracle
//! transforms with `grep ',CITY,' IN | cut -d , -f 2,4 > OUT`; from level 2 it prints the
//! outputs to check them, from level 3 it reads each input first.

use std::collections::BTreeMap;

use super::{recover, sh, Parts};
use crate::checker::{Checker, FileExpectation};
use crate::families::PlanBuilder;
use crate::rng::SplitMix64;

/// Input files, by level.
const FILES: [usize; 8] = [1, 1, 1, 1, 2, 3, 5, 7];
/// Rows per input, by level.
const ROWS: [usize; 8] = [4, 6, 10, 14, 18, 24, 30, 36];
const REGIONS: [&str; 7] = [
    "north", "south", "east", "west", "central", "coast", "hills",
];
const CITIES: [&str; 8] = [
    "Lyon", "Porto", "Oslo", "Quito", "Perth", "Hanoi", "Accra", "Lima",
];
const SYLLABLES: [&str; 12] = [
    "ka", "lo", "mi", "ra", "ten", "vo", "sa", "del", "ni", "ur", "bes", "yo",
];

fn person(rng: &mut SplitMix64) -> String {
    let n = rng.range(2, 3);
    let w: String = (0..n).map(|_| *rng.pick(&SYLLABLES)).collect();
    let mut c = w.chars();
    c.next()
        .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
        .unwrap_or_default()
}

pub(super) fn build(level: u32, recovery: bool, rng: &mut SplitMix64) -> Parts {
    let li = level as usize - 1;
    let mut files = BTreeMap::new();
    let mut expect = BTreeMap::new();
    let mut jobs = Vec::new();
    let mut id = 100;
    for region in REGIONS.iter().take(FILES[li]) {
        let input = format!("data/{region}.csv");
        let city = *rng.pick(&CITIES);
        let mut text = String::from("id,name,city,score,active\n");
        for r in 0..ROWS[li] {
            // The first row is in the asked city so every filter keeps something.
            let c = if r == 0 { city } else { *rng.pick(&CITIES) };
            let (name, score) = (person(rng), rng.range(10, 99));
            id += 1;
            text.push_str(&format!(
                "{id},{name},{c},{score},{}\n",
                rng.pick(&["yes", "no"])
            ));
        }
        // Shuffle the data rows (not the header).
        let mut rows: Vec<&str> = text.lines().skip(1).collect();
        rng.shuffle(&mut rows);
        let text = format!("id,name,city,score,active\n{}\n", rows.join("\n"));
        let kept: String = rows
            .iter()
            .filter(|r| r.split(',').nth(2) == Some(city))
            .map(|r| {
                let f: Vec<&str> = r.split(',').collect();
                format!("{},{}\n", f[1], f[3])
            })
            .collect();
        let output = format!("{region}-{}.csv", city.to_lowercase());
        expect.insert(output.clone(), FileExpectation::Equals { text: kept });
        files.insert(input.clone(), text.into_bytes());
        jobs.push((input, city, output));
    }
    let asks: Vec<String> = jobs
        .iter()
        .map(|(i, c, o)| format!("{i} → {o} (city {c})"))
        .collect();
    let prompt = if level == 1 {
        let (input, city, output) = &jobs[0];
        format!(
            "{input} has the header `id,name,city,score,active`. Write {output} with the \
             `name,score` of its rows in {city}, in order, no header. Use the shell tool (grep, \
             cut, `>`), then call answer with 1."
        )
    } else {
        format!(
            "CSV files under data/ have the header `id,name,city,score,active`. For each of: {}, \
         write the output file with the `name,score` of the input's rows in that city, one \
         per line, in the input's order, without a header. Use the shell tool (grep, cut, \
         `>`), then call answer with the number of files you wrote.",
            asks.join("; ")
        )
    };
    let mut plan = PlanBuilder::new(&files, &[]);
    if recovery {
        recover(&mut plan, "data/input.csv", "data");
    }
    for (input, city, output) in &jobs {
        if level >= 3 {
            sh(&mut plan, format!("cat {input}"));
        }
        sh(
            &mut plan,
            format!("grep ',{city},' {input} | cut -d , -f 2,4 > {output}"),
        );
    }
    if level >= 2 {
        let outs: Vec<&str> = jobs.iter().map(|(_, _, o)| o.as_str()).collect();
        sh(&mut plan, format!("cat {}", outs.join(" ")));
    }
    Parts {
        files,
        prompt,
        steps: plan.finish(),
        checker: Checker::FileState { files: expect },
        answer: jobs.len().to_string(),
        needed: jobs.into_iter().map(|(i, _, _)| i).collect(),
    }
}
