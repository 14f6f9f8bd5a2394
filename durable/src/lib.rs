//! corvid-durable: files that are never seen half-written. A policy folder's weights and
//! config, a run's group-id reservation, the store's count of acknowledged trajectories, a
//! cut metrics log, the toolbox module written out for a task pack: each is replaced whole
//! by [`replace_file`], and a folder's new names are made durable by [`sync_dir`].
//!
//! It is its own crate because the model (policy folders), the store, the learner (run
//! checkpoints) and the actor (its spool) all need it, and none of them may depend on another.
#![deny(missing_docs)]

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

/// Replaces `path` with `bytes` whole: they are written to `<path>.tmp`, fsynced, renamed over
/// `path`, and the folder is fsynced so the new name is durable too. A crash at any point
/// leaves either the old file or the new one.
pub fn replace_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = Path::new(&tmp);
    let mut f = File::create(tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(tmp, path)?;
    match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => sync_dir(dir),
        None => Ok(()),
    }
}

/// Fsyncs the folder `dir`, so that the names created or renamed in it are durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replaced_file_holds_the_new_bytes_and_no_temporary_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("count.json");
        std::fs::write(&path, b"old").unwrap();
        replace_file(&path, b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec!["count.json"]);
    }
}
