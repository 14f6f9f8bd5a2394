//! `config`: service config files under `conf/` with `key=value` settings and `#`
//! comments, some lines malformed (`key: value`, `key = value`, `key value`). The check
//! command ([`check_command`]) lists the malformed lines of a file; the agent repairs them with
//! `sed -i` (each to `key=value`, keeping key and value) until the check lists none.
//! Level 1 names the broken line; from level 2 the oracle runs the check to find the
//! lines, from level 3 it reads the file first. The checker compares every file with
//! its repaired form.

use std::collections::BTreeMap;

use super::{recover, sh, Parts};
use crate::checker::{Checker, FileExpectation};
use crate::families::PlanBuilder;
use crate::rng::SplitMix64;

/// The check command's pattern: a comment, an empty line or `key=value` (no spaces).
pub const VALID: &str = "^(#.*|[a-z_]+=[^ ]+)?$";

/// Config files, by level.
const FILES: [usize; 8] = [1, 1, 1, 1, 2, 2, 3, 5];
/// Settings per file, by level.
const SETTINGS: [usize; 8] = [4, 8, 12, 16, 18, 24, 30, 36];
/// Malformed settings per file, by level.
const BROKEN: [usize; 8] = [1, 2, 2, 3, 3, 3, 4, 4];
const SERVICES: [&str; 5] = ["gateway", "billing", "search", "mailer", "scheduler"];
const SECTIONS: [&str; 8] = [
    "http", "db", "cache", "log", "auth", "queue", "metrics", "tls",
];
const NAMES: [&str; 10] = [
    "port",
    "host",
    "timeout_ms",
    "retries",
    "pool_size",
    "level",
    "path",
    "enabled",
    "max_items",
    "ttl_s",
];
const WORDS: [&str; 6] = ["on", "off", "info", "debug", "primary", "replica"];

/// The check command for `file`.
pub fn check_command(file: &str) -> String {
    format!("grep -nvE '{VALID}' {file}")
}

pub(super) fn build(level: u32, recovery: bool, rng: &mut SplitMix64) -> Parts {
    let li = level as usize - 1;
    let mut files = BTreeMap::new();
    let mut expect = BTreeMap::new();
    // (file, [(key, broken form's separator)])
    let mut jobs: Vec<(String, Vec<(String, &str)>)> = Vec::new();
    let mut total_broken = 0;
    for svc in SERVICES.iter().take(FILES[li]) {
        let file = format!("conf/{svc}.conf");
        let mut keys: Vec<String> = Vec::new();
        while keys.len() < SETTINGS[li] {
            let k = format!("{}_{}", rng.pick(&SECTIONS), rng.pick(&NAMES));
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        let mut good = format!("# {svc} settings\n");
        let mut lines = vec![format!("# {svc} settings")];
        let broken: Vec<usize> = {
            let mut idx: Vec<usize> = (0..keys.len()).collect();
            rng.shuffle(&mut idx);
            idx.truncate(BROKEN[li]);
            idx
        };
        let mut fixes = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            if i > 0 && i % 6 == 0 {
                let c = format!("# {} section", k.split('_').next().unwrap_or(k));
                good.push_str(&c);
                good.push('\n');
                lines.push(c);
            }
            let v = match rng.below(3) {
                0 => rng.range(1, 9000).to_string(),
                1 => rng.pick(&WORDS).to_string(),
                _ => format!("/var/{}/{}", svc, rng.pick(&NAMES)),
            };
            good.push_str(&format!("{k}={v}\n"));
            if broken.contains(&i) {
                let sep = *rng.pick(&[": ", " = ", " "]);
                lines.push(format!("{k}{sep}{v}"));
                fixes.push((k.clone(), sep));
            } else {
                lines.push(format!("{k}={v}"));
            }
        }
        total_broken += fixes.len();
        files.insert(file.clone(), (lines.join("\n") + "\n").into_bytes());
        expect.insert(file.clone(), FileExpectation::Equals { text: good });
        jobs.push((file, fixes));
    }
    let prompt = if level == 1 {
        let (file, fixes) = &jobs[0];
        format!(
            "In {file} the setting `{}` is written with {:?} instead of `=`. Repair it in \
             place (shell tool, sed -i) to `key=value`, then call answer with 1.",
            fixes[0].0, fixes[0].1
        )
    } else {
        let names: Vec<&str> = jobs.iter().map(|(f, _)| f.as_str()).collect();
        format!(
            "The config files {} must hold only comments (`#`), empty lines and settings \
             written `key=value` (no spaces). `{}` lists the malformed lines of FILE. Repair \
             every malformed line in place (sed -i), keeping its key and value, until the check \
             lists none. Then call answer with the number of lines you repaired.",
            names.join(", "),
            check_command("FILE")
        )
    };
    let mut plan = PlanBuilder::new(&files, &[]);
    if recovery {
        recover(&mut plan, "conf/app.conf", "conf");
    }
    for (file, fixes) in &jobs {
        if level >= 3 {
            sh(&mut plan, format!("cat {file}"));
        }
        if level >= 2 {
            sh(&mut plan, check_command(file));
        }
        let script: Vec<String> = fixes
            .iter()
            .map(|(k, sep)| format!("s/^{k}{sep}/{k}=/"))
            .collect();
        sh(&mut plan, format!("sed -i '{}' {file}", script.join(";")));
    }
    Parts {
        files,
        prompt,
        steps: plan.finish(),
        checker: Checker::FileState { files: expect },
        answer: total_broken.to_string(),
        needed: jobs.into_iter().map(|(f, _)| f).collect(),
    }
}
