//! Opening a store by folder, the way every command does: [`open_existing`] for readers
//! (`corvid replay`, a resumed learner), which refuse a folder that holds no store rather
//! than turn it into an empty one, and [`open_or_create`] for writers (`corvid eval`, a new
//! learner), which refuse a folder that holds other files. Both say what the folder is and,
//! where a run folder was given for its `store/`, name that.

use std::path::{Path, PathBuf};

use crate::{StoreError, TrajectoryStore};

/// Why a store folder was refused.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Nothing is at the path.
    #[error("no store at {}: it does not exist", path.display())]
    Missing {
        /// The path given.
        path: PathBuf,
    },
    /// The path is a file.
    #[error("no store at {}: it is a file, not a folder", path.display())]
    NotAFolder {
        /// The path given.
        path: PathBuf,
    },
    /// The folder holds no sled store (for [`open_existing`]) or holds other files (for
    /// [`open_or_create`]).
    #[error(
        "no store at {}: the folder holds {} but no trajectory store (no sled `conf` and `db`){}",
        path.display(),
        if *empty { "nothing" } else { "other files" },
        hint(path)
    )]
    NotAStore {
        /// The path given.
        path: PathBuf,
        /// Whether the folder is empty.
        empty: bool,
    },
    /// Making the folder's parent failed.
    #[error("creating {}: {source}", path.display())]
    Create {
        /// The folder.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The store did not open.
    #[error("opening the store at {}: {}", path.display(), why(source))]
    Open {
        /// The folder.
        path: PathBuf,
        /// The store's error.
        #[source]
        source: StoreError,
    },
}

impl OpenError {
    /// Whether another process holds the store open (sled allows one).
    pub fn is_locked(&self) -> bool {
        matches!(self, OpenError::Open { source, .. } if source.is_locked())
    }
}

fn hint(path: &Path) -> String {
    if is_store(&path.join("store")) {
        format!("; did you mean {}?", path.join("store").display())
    } else {
        String::new()
    }
}

fn why(e: &StoreError) -> &'static str {
    if e.is_locked() {
        "another process has it open (sled allows one; read a stopped learner's store or a copy)"
    } else {
        "the store is unreadable"
    }
}

/// Whether `path` holds a sled store: sled keeps its configuration in `conf` and its log in
/// `db`.
pub fn is_store(path: &Path) -> bool {
    path.join("conf").is_file() && path.join("db").is_file()
}

fn open(path: &Path) -> Result<TrajectoryStore, OpenError> {
    TrajectoryStore::open(path).map_err(|source| OpenError::Open {
        path: path.to_path_buf(),
        source,
    })
}

/// Opens the store in `path`, which must exist and hold one.
pub fn open_existing(path: &Path) -> Result<TrajectoryStore, OpenError> {
    let p = path.to_path_buf();
    if !path.exists() {
        return Err(OpenError::Missing { path: p });
    }
    if !path.is_dir() {
        return Err(OpenError::NotAFolder { path: p });
    }
    if !is_store(path) {
        let empty = std::fs::read_dir(path).map_or(true, |mut d| d.next().is_none());
        return Err(OpenError::NotAStore { path: p, empty });
    }
    open(path)
}

/// Opens the store in `path`, creating it (and its parent folders) where `path` does not
/// exist or is an empty folder.
pub fn open_or_create(path: &Path) -> Result<TrajectoryStore, OpenError> {
    let p = path.to_path_buf();
    if path.exists() && !path.is_dir() {
        return Err(OpenError::NotAFolder { path: p });
    }
    let empty = std::fs::read_dir(path).map_or(true, |mut d| d.next().is_none());
    if !is_store(path) && !empty {
        return Err(OpenError::NotAStore { path: p, empty });
    }
    if let Some(parent) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|source| OpenError::Create {
            path: parent.to_path_buf(),
            source,
        })?;
    }
    open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_existing_refuses_what_is_not_a_store_and_names_the_run_folders_store() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        assert!(matches!(
            open_existing(&missing),
            Err(OpenError::Missing { .. })
        ));
        assert!(!missing.exists(), "a missing store is not created");
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(matches!(
            open_existing(&file),
            Err(OpenError::NotAFolder { .. })
        ));
        // A run folder: its store is in store/.
        let run = dir.path().join("run");
        drop(open_or_create(&run.join("store")).unwrap());
        let err = open_existing(&run).unwrap_err().to_string();
        assert!(
            err.contains("holds other files") && err.contains("did you mean"),
            "{err}"
        );
        assert!(open_existing(&run.join("store")).is_ok());
    }

    #[test]
    fn open_or_create_makes_a_new_store_and_refuses_a_folder_of_other_files() {
        let dir = tempfile::tempdir().unwrap();
        let new = dir.path().join("a/b/store");
        drop(open_or_create(&new).unwrap());
        assert!(is_store(&new));
        drop(open_or_create(&new).unwrap());
        let other = dir.path().join("other");
        std::fs::create_dir(&other).unwrap();
        std::fs::write(other.join("notes.txt"), b"keep me").unwrap();
        let err = open_or_create(&other).unwrap_err();
        assert!(
            matches!(err, OpenError::NotAStore { empty: false, .. }),
            "{err}"
        );
        assert_eq!(std::fs::read(other.join("notes.txt")).unwrap(), b"keep me");
    }

    #[test]
    fn a_store_held_by_another_handle_is_refused_as_locked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store");
        let _held = open_or_create(&path).unwrap();
        let err = open_existing(&path).unwrap_err();
        assert!(err.is_locked(), "{err}");
        assert!(
            err.to_string().contains("another process has it open"),
            "{err}"
        );
    }
}
