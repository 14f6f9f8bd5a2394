//! Test helpers: options like `corvid eval`'s defaults, a random checkpoint on disk, and a
//! whole evaluation into a store folder.

use std::path::{Path, PathBuf};

use anyhow::Result;
use corvid_actor::LoadedPolicy;
use corvid_model::{checkpoint, ModelConfig};
use corvid_tasks::TaskEnv;

use crate::{open_store, EvalOptions, EvalResult, Plan, PolicySource};

/// `corvid eval`'s defaults for `policy`, on one hops level-1 instance.
pub fn options(policy: PolicySource) -> EvalOptions {
    EvalOptions {
        policy,
        tool_call_format: None,
        family: "hops".into(),
        pack: None,
        levels: (1, 1),
        episodes: 1,
        k: 1,
        temperature: 0.0,
        top_p: 1.0,
        max_new_tokens: 256,
        seed: 1 << 62,
        concurrency: 32,
        threads: 1,
        label: None,
        stage: "eval".into(),
        progress: true,
        context: None,
    }
}

/// One hops level-1 episode of a random initialisation of the tiny preset.
pub fn random_l1() -> EvalOptions {
    options(PolicySource::RandomInit {
        preset: "tiny".into(),
        config: None,
    })
}

/// The checkpoint folder `dir` as a policy source (no `state.json`: version 0).
pub fn checkpoint_at(dir: &Path) -> PolicySource {
    PolicySource::Checkpoint {
        dir: dir.to_path_buf(),
        policy_version: 0,
    }
}

/// Saves a fresh random initialisation of the tiny preset as a checkpoint folder.
pub fn random_checkpoint(dir: &Path) -> PathBuf {
    let cfg = ModelConfig::preset("tiny").expect("tiny");
    let p = LoadedPolicy::random(&cfg, tch::Device::Cpu).expect("random policy");
    checkpoint::save(p.var_store(), &cfg, dir).expect("saves");
    dir.to_path_buf()
}

/// Plans `opts`, then runs it into the store at `store` (created if need be), with tasks in
/// the sandbox `corvid eval` uses.
pub fn evaluate(opts: EvalOptions, store: &Path) -> Result<EvalResult> {
    let plan = Plan::new(opts)?;
    let sandbox = corvid_sandbox::Sandbox::builder()
        .search_tool(true)
        .build()?;
    let store = open_store(store)?;
    plan.run(&TaskEnv::new(sandbox), &store)
}
