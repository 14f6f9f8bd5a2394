//! Small files that must never be seen half-written: a run's group-id reservation, the
//! store's count of acknowledged trajectories, a cut metrics log.

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
        Some(dir) => File::open(dir)?.sync_all(),
        None => Ok(()),
    }
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
