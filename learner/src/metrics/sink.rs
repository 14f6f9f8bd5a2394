//! [`MetricsSink`]: appends one [`UpdateRecord`] per update to `metrics.jsonl` and keeps the
//! latest in memory for the Prometheus endpoint. A resumed run first cuts the lines written
//! after its checkpoint ([`MetricsSink::truncate_after`]), so steps never repeat.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use super::UpdateRecord;

/// Appends records to the JSONL file and keeps the latest for the Prometheus endpoint.
#[derive(Debug)]
pub struct MetricsSink {
    path: PathBuf,
    file: std::fs::File,
    latest: Arc<RwLock<Option<UpdateRecord>>>,
}

impl MetricsSink {
    /// Opens `path` for appending (creating its folder).
    pub fn open(path: &Path) -> std::io::Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
            latest: Arc::new(RwLock::new(None)),
        })
    }

    /// Removes lines whose `step` is above `step` (written after the checkpoint a run resumes
    /// from), so that the resumed run's lines continue the file without repeats.
    pub fn truncate_after(path: &Path, step: u64) -> std::io::Result<usize> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e),
        };
        let mut kept = String::with_capacity(text.len());
        let mut dropped = 0;
        for line in text.lines() {
            let s = serde_json::from_str::<serde_json::Value>(line)
                .ok()
                .and_then(|v| v.get("step").and_then(|s| s.as_u64()));
            match s {
                Some(s) if s > step => dropped += 1,
                // A torn last line (killed mid-write) is dropped too.
                None => dropped += 1,
                Some(_) => {
                    kept.push_str(line);
                    kept.push('\n');
                }
            }
        }
        if dropped > 0 {
            corvid_durable::replace_file(path, kept.as_bytes())?;
        }
        Ok(dropped)
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The latest record, shared with the Prometheus endpoint.
    pub fn latest(&self) -> Arc<RwLock<Option<UpdateRecord>>> {
        Arc::clone(&self.latest)
    }

    /// Records a batch consumed without an update in the latest record, so that the endpoint
    /// shows `service_batches_skipped` rising while no update (and no line) is written.
    pub fn note_batches_skipped(&self, total: u64) {
        let mut latest = self.latest.write().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = latest.as_mut() {
            r.service.batches_skipped = total;
        }
    }

    /// Writes one line and makes `record` the latest.
    pub fn write(&mut self, record: &UpdateRecord) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(record)?;
        line.push(b'\n');
        self.file.write_all(&line)?;
        self.file.flush()?;
        *self.latest.write().unwrap_or_else(|p| p.into_inner()) = Some(record.clone());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_after_drops_later_and_torn_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.jsonl");
        let mut sink = MetricsSink::open(&path).unwrap();
        for step in 1..=5 {
            sink.write(&UpdateRecord {
                step,
                ..UpdateRecord::default()
            })
            .unwrap();
        }
        drop(sink);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(b"{\"step\": 6, \"tor").unwrap();
        assert_eq!(MetricsSink::truncate_after(&path, 3).unwrap(), 3);
        let steps: Vec<u64> = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<UpdateRecord>(l).unwrap().step)
            .collect();
        assert_eq!(steps, vec![1, 2, 3]);
    }
}
