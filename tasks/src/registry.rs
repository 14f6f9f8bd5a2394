//! Looking families up by name: the built-in families plus the task packs a run names.

use std::path::PathBuf;

use crate::error::TasksError;
use crate::families::builtin_family;
use crate::pack::{load_pack, TaskPack};
use crate::task::TaskFamily;

/// The families a run can draw from: built-ins, and packs loaded from files.
#[derive(Debug, Clone, Default)]
pub struct Families {
    packs: Vec<TaskPack>,
}

impl Families {
    /// Loads and validates every pack file; two packs with the same name are an error.
    pub fn new(pack_files: &[PathBuf]) -> Result<Self, TasksError> {
        let mut packs: Vec<TaskPack> = Vec::with_capacity(pack_files.len());
        for path in pack_files {
            let pack = load_pack(path)?;
            if packs.iter().any(|p| p.name() == pack.name()) {
                return Err(TasksError::InvalidConfig {
                    field: "tasks.packs".into(),
                    value: path.display().to_string(),
                    expected: format!("one file per pack name; `{}` is loaded twice", pack.name()),
                });
            }
            packs.push(pack);
        }
        Ok(Self { packs })
    }

    /// The family called `name`: a loaded pack of that name, else a built-in family.
    pub fn get(&self, name: &str) -> Result<Box<dyn TaskFamily>, TasksError> {
        match self.packs.iter().find(|p| p.name() == name) {
            Some(p) => Ok(Box::new(p.clone())),
            None => builtin_family(name).map_err(|e| match e {
                TasksError::UnknownFamily { name, known } => TasksError::UnknownFamily {
                    name,
                    known: self
                        .packs
                        .iter()
                        .map(|p| p.name().to_string())
                        .chain(std::iter::once(known))
                        .collect::<Vec<_>>()
                        .join(", "),
                },
                other => other,
            }),
        }
    }

    /// Names of the loaded packs.
    pub fn pack_names(&self) -> Vec<&str> {
        self.packs.iter().map(|p| p.name()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packs_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("packs")
    }

    #[test]
    fn packs_and_builtins_are_found_by_name() {
        let f = Families::new(&[packs_dir().join("greeting-fix.toml")]).unwrap();
        assert_eq!(f.get("greeting-fix").unwrap().name(), "greeting-fix");
        assert_eq!(f.get("hops").unwrap().name(), "hops");
        let err = f.get("nope").err().expect("unknown").to_string();
        assert!(
            err.contains("greeting-fix") && err.contains("hops"),
            "{err}"
        );
    }

    #[test]
    fn a_pack_loaded_twice_is_refused() {
        let p = packs_dir().join("greeting-fix.toml");
        let err = Families::new(&[p.clone(), p]).unwrap_err().to_string();
        assert!(err.contains("loaded twice"), "{err}");
    }
}
