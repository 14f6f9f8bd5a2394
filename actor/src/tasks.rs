//! Turning the learner's task references back into task instances.
//!
//! An assignment names its instance by `(family, level, seed, spec_hash)`. The actor
//! rebuilds the instance from its own copy of the family (built-in, or a task pack given on
//! the command line) and refuses it when the hash differs: the two sides would otherwise
//! disagree about what the episode was. Instances are cached, since the G episodes of a
//! group share one.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use corvid_proto::TaskRef;
use corvid_tasks::{load_pack, TaskFamily, TaskInstance, TaskPack};

use crate::error::ActorError;

/// Instances kept in the cache.
const CACHE_ENTRIES: usize = 256;

/// Rebuilds and checks task instances.
pub struct TaskResolver {
    packs: HashMap<String, TaskPack>,
    cache: Mutex<HashMap<(String, u32, u64), Arc<TaskInstance>>>,
}

impl std::fmt::Debug for TaskResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskResolver")
            .field("packs", &self.packs.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl TaskResolver {
    /// Built-in families plus the task packs at `packs` (a pack's name shadows a built-in
    /// family of the same name).
    pub fn new(packs: &[PathBuf]) -> Result<Self, ActorError> {
        let mut map = HashMap::new();
        for p in packs {
            let pack = load_pack(p).map_err(|e| ActorError::Task {
                task: p.display().to_string(),
                why: e.to_string(),
            })?;
            map.insert(pack.name().to_string(), pack);
        }
        Ok(Self {
            packs: map,
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// The instance `r` names; an error when the family or level is unknown here or the
    /// spec hash differs from the learner's.
    pub fn resolve(&self, r: &TaskRef) -> Result<Arc<TaskInstance>, ActorError> {
        let key = (r.family.clone(), r.level, r.seed);
        let cached = self
            .cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .cloned();
        let inst = match cached {
            Some(i) => i,
            None => {
                let err = |why: String| ActorError::Task {
                    task: r.instance_key(),
                    why,
                };
                let inst = match self.packs.get(&r.family) {
                    Some(pack) => pack.instance(r.level, r.seed),
                    None => corvid_tasks::builtin_family(&r.family)
                        .map_err(|e| {
                            err(format!(
                                "{e}; if it is a task pack, start this actor with \
                                 --task-pack FILE (the learner's [tasks] packs)"
                            ))
                        })?
                        .instance(r.level, r.seed),
                }
                .map_err(|e| err(e.to_string()))?;
                let inst = Arc::new(inst);
                let mut c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
                if c.len() >= CACHE_ENTRIES {
                    c.clear();
                }
                c.insert(key, inst.clone());
                inst
            }
        };
        if inst.spec_hash != r.spec_hash {
            return Err(ActorError::Task {
                task: r.instance_key(),
                why: format!(
                    "spec hash {} here, {} at the learner: the task definitions differ",
                    inst.spec_hash, r.spec_hash
                ),
            });
        }
        Ok(inst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_builtins_and_refuses_a_different_spec() {
        let r = TaskResolver::new(&[]).unwrap();
        let inst = corvid_tasks::builtin_family("hops")
            .unwrap()
            .instance(2, 9)
            .unwrap();
        let mut tr = inst.task_ref();
        assert_eq!(*r.resolve(&tr).unwrap(), inst);
        tr.spec_hash = "0".repeat(64);
        let err = r.resolve(&tr).unwrap_err().to_string();
        assert!(err.contains("spec hash"), "{err}");
        tr.family = "no-such-family".into();
        let err = r.resolve(&tr).unwrap_err().to_string();
        assert!(
            err.contains("no-such-family") && err.contains("--task-pack"),
            "{err}"
        );
    }
}
