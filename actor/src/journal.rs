//! The on-disk journal of one trajectory: its wire parts, appended as the episode grows.
//!
//! A long episode never sits whole in memory: each part (header, step chunk, footer) is
//! appended here the moment it exists, and every (re)submission streams the file back part
//! by part. The journal is also the spool's format: a finished journal *is* a spooled
//! trajectory.
//!
//! Record layout, repeated: `len: u32 LE`, `crc32(payload): u32 LE`, `payload` = the
//! protobuf encoding of one `corvid.v1.TrajectoryPart`. A crash can leave a torn last
//! record; readers stop at the first record that is short or fails its checksum (and say
//! which, [`Stopped`]), and [`seal_abandoned`] cuts a torn tail before closing the file
//! with a footer. It never cuts a complete record that fails its checksum or does not
//! decode: a crash while appending cannot produce one, so it is damage, and what follows
//! it may be intact.

use std::fs::{File, OpenOptions};
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use corvid_proto::encoded::{trajectory_part::Part, TrajectoryPart};
use corvid_proto::pb;
use corvid_proto::{Step, Termination, TrajectoryFooter, TrajectoryHeader};
use prost::Message;

use crate::episode::unix_ms;
use crate::error::ActorError;

/// Largest record accepted when reading (a step chunk is far smaller).
const MAX_RECORD_BYTES: u32 = 64 << 20;

/// Appends parts to a journal file.
#[derive(Debug)]
pub struct JournalWriter {
    path: PathBuf,
    out: BufWriter<File>,
    records: u64,
    next_seq: u64,
    tokens: u64,
    generated: u64,
}

impl JournalWriter {
    /// Creates (or truncates) the journal at `path`.
    pub fn create(path: &Path) -> Result<Self, ActorError> {
        let file = File::create(path).map_err(ActorError::io(path))?;
        Ok(Self {
            path: path.to_path_buf(),
            out: BufWriter::new(file),
            records: 0,
            next_seq: 0,
            tokens: 0,
            generated: 0,
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Parts appended so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Appends a wire part as it is (a step as the bytes it was encoded to once).
    pub fn append(&mut self, part: &TrajectoryPart) -> Result<(), ActorError> {
        let bytes = part.encode_to_vec();
        let len = u32::try_from(bytes.len())
            .ok()
            .filter(|&n| n <= MAX_RECORD_BYTES)
            .ok_or_else(|| ActorError::Journal {
                path: self.path.display().to_string(),
                why: format!("a part of {} bytes is too large to journal", bytes.len()),
            })?;
        let crc = crc32fast::hash(&bytes);
        let io = ActorError::io(&self.path);
        self.out
            .write_all(&len.to_le_bytes())
            .and_then(|_| self.out.write_all(&crc.to_le_bytes()))
            .and_then(|_| self.out.write_all(&bytes))
            .map_err(io)?;
        self.records += 1;
        Ok(())
    }

    /// Appends the header; returns its wire part.
    pub fn header(&mut self, h: &TrajectoryHeader) -> Result<TrajectoryPart, ActorError> {
        let part = TrajectoryPart::header(h.clone());
        self.append(&part)?;
        Ok(part)
    }

    /// Appends the next step chunk (seq 0, 1, …); returns its wire part.
    pub fn step(&mut self, s: Step) -> Result<TrajectoryPart, ActorError> {
        self.tokens += s.token_ids.len() as u64;
        self.generated += s.generated_count() as u64;
        let part = TrajectoryPart::step(self.next_seq, s);
        self.next_seq += 1;
        self.append(&part)?;
        Ok(part)
    }

    /// Appends the footer and makes the whole journal durable; returns its wire part.
    pub fn footer(&mut self, f: TrajectoryFooter) -> Result<TrajectoryPart, ActorError> {
        let part = TrajectoryPart::footer(f);
        self.append(&part)?;
        self.sync()?;
        Ok(part)
    }

    /// Pushes buffered records to the file (so a reader sees them).
    pub fn flush(&mut self) -> Result<(), ActorError> {
        self.out.flush().map_err(ActorError::io(&self.path))
    }

    /// Flushes and fsyncs.
    pub fn sync(&mut self) -> Result<(), ActorError> {
        self.flush()?;
        self.out
            .get_ref()
            .sync_all()
            .map_err(ActorError::io(&self.path))
    }
}

/// Why a [`JournalReader`] stopped before the end of its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stopped {
    /// The file ends inside the record at `offset`: what a crash in the middle of an
    /// append leaves (a torn tail).
    Torn {
        /// Where the incomplete record starts.
        offset: u64,
    },
    /// The record at `offset` is complete but claims more than the record limit, fails
    /// its checksum or does not decode: damage, not a crash.
    Damaged {
        /// Where the record starts.
        offset: u64,
        /// What is wrong with it.
        why: String,
    },
}

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stopped::Torn { offset } => {
                write!(f, "the file ends inside the record at offset {offset}")
            }
            Stopped::Damaged { offset, why } => write!(f, "the record at offset {offset} {why}"),
        }
    }
}

/// Reads a journal's parts in order, stopping quietly at a torn or damaged record
/// ([`JournalReader::stopped`] says which).
#[derive(Debug)]
pub struct JournalReader {
    path: PathBuf,
    input: BufReader<File>,
    /// Bytes of whole, valid records read so far.
    valid_len: u64,
    done: bool,
    stopped: Option<Stopped>,
}

impl JournalReader {
    /// Opens the journal at `path`.
    pub fn open(path: &Path) -> Result<Self, ActorError> {
        let file = File::open(path).map_err(ActorError::io(path))?;
        Ok(Self {
            path: path.to_path_buf(),
            input: BufReader::new(file),
            valid_len: 0,
            done: false,
            stopped: None,
        })
    }

    /// Length of the valid prefix read so far.
    pub fn valid_len(&self) -> u64 {
        self.valid_len
    }

    /// Why reading stopped before the end of the file (`None`: it has not, or it reached
    /// the end at a record boundary).
    pub fn stopped(&self) -> Option<&Stopped> {
        self.stopped.as_ref()
    }

    fn stop(&mut self, why: Option<String>) -> Result<Option<TrajectoryPart>, ActorError> {
        let offset = self.valid_len;
        self.done = true;
        self.stopped = Some(match why {
            None => Stopped::Torn { offset },
            Some(why) => Stopped::Damaged { offset, why },
        });
        Ok(None)
    }

    /// Reads until `buf` is full or the file ends; returns the bytes read.
    fn fill(&mut self, buf: &mut [u8]) -> Result<usize, ActorError> {
        let mut got = 0;
        while got < buf.len() {
            match self.input.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(ActorError::io(&self.path)(e)),
            }
        }
        Ok(got)
    }

    /// The next part, `None` at the end or at a torn/damaged record.
    pub fn next_part(&mut self) -> Result<Option<TrajectoryPart>, ActorError> {
        if self.done {
            return Ok(None);
        }
        let mut head = [0u8; 8];
        let got = self.fill(&mut head)?;
        if got == 0 {
            self.done = true; // the end, at a record boundary
            return Ok(None);
        }
        if got < head.len() {
            return self.stop(None);
        }
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
        let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        if len > MAX_RECORD_BYTES {
            return self.stop(Some(format!(
                "claims {len} bytes, over the {MAX_RECORD_BYTES}-byte record limit"
            )));
        }
        let mut payload = vec![0u8; len as usize];
        if self.fill(&mut payload)? < payload.len() {
            return self.stop(None);
        }
        if crc32fast::hash(&payload) != crc {
            return self.stop(Some("fails its checksum".into()));
        }
        // A step chunk's step is bytes on this side; it must decode as a step too.
        let decoded = TrajectoryPart::decode(payload.as_slice())
            .map_err(|e| e.to_string())
            .and_then(|p| match &p.part {
                Some(Part::Step(chunk)) => {
                    pb::Step::decode(chunk.step.as_deref().unwrap_or_default())
                        .map_err(|e| format!("step chunk seq {}: {e}", chunk.seq))?;
                    Ok(p)
                }
                _ => Ok(p),
            });
        match decoded {
            Ok(p) => {
                self.valid_len += 8 + u64::from(len);
                Ok(Some(p))
            }
            Err(e) => self.stop(Some(format!("does not decode: {e}"))),
        }
    }
}

impl Iterator for JournalReader {
    type Item = Result<TrajectoryPart, ActorError>;
    fn next(&mut self) -> Option<Self::Item> {
        self.next_part().transpose()
    }
}

/// What a journal holds.
#[derive(Debug, Clone)]
pub struct JournalSummary {
    /// The trajectory's header, if it got that far.
    pub header: Option<TrajectoryHeader>,
    /// Step chunks.
    pub steps: u64,
    /// Tokens over all steps.
    pub tokens: u64,
    /// Generated tokens over all steps.
    pub generated: u64,
    /// The footer, if the episode finished.
    pub footer: Option<TrajectoryFooter>,
    /// Bytes of valid records (the rest, if any, is a torn tail or starts with damage).
    pub valid_len: u64,
    /// Why reading stopped before the end of the file, if it did.
    pub stopped: Option<Stopped>,
}

/// Reads a whole journal (one record at a time) and summarises it.
pub fn scan(path: &Path) -> Result<JournalSummary, ActorError> {
    let mut r = JournalReader::open(path)?;
    let mut s = JournalSummary {
        header: None,
        steps: 0,
        tokens: 0,
        generated: 0,
        footer: None,
        valid_len: 0,
        stopped: None,
    };
    let bad = |why: String| ActorError::Journal {
        path: path.display().to_string(),
        why,
    };
    while let Some(part) = r.next_part()? {
        match part.part {
            Some(Part::Header(h)) => {
                s.header = Some(TrajectoryHeader::try_from(h).map_err(|e| bad(e.to_string()))?)
            }
            Some(Part::Step(c)) => {
                let bytes = c
                    .step
                    .ok_or_else(|| bad("step chunk without a step".into()))?;
                let wire = pb::Step::decode(bytes).map_err(|e| bad(e.to_string()))?;
                let step = Step::try_from(wire).map_err(|e| bad(e.to_string()))?;
                s.steps += 1;
                s.tokens += step.token_ids.len() as u64;
                s.generated += step.generated_count() as u64;
            }
            Some(Part::Footer(f)) => {
                s.footer = Some(TrajectoryFooter::try_from(f).map_err(|e| bad(e.to_string()))?)
            }
            None => return Err(bad("an empty part".into())),
        }
        s.valid_len = r.valid_len();
    }
    s.stopped = r.stopped().cloned();
    Ok(s)
}

/// Closes a journal left without a footer (the actor died mid-episode): cuts any torn
/// tail and appends an `abandoned` footer whose totals match its steps. Returns the
/// summary after sealing. A journal without even a header cannot be submitted, and one
/// whose reading stopped at a damaged record ([`Stopped::Damaged`]) is not cut (what
/// follows the damage may be intact): both are reported as [`ActorError::Journal`] and
/// the file is left as it is.
pub fn seal_abandoned(path: &Path) -> Result<JournalSummary, ActorError> {
    let mut s = scan(path)?;
    if s.footer.is_some() {
        return Ok(s);
    }
    if s.header.is_none() {
        return Err(ActorError::Journal {
            path: path.display().to_string(),
            why: "no header was written; nothing to submit".into(),
        });
    }
    if let Some(d @ Stopped::Damaged { .. }) = &s.stopped {
        return Err(ActorError::Journal {
            path: path.display().to_string(),
            why: format!(
                "{d}; not cutting it there, since what follows may be intact (records \
                 before it: {} bytes)",
                s.valid_len
            ),
        });
    }
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(ActorError::io(path))?;
    file.set_len(s.valid_len).map_err(ActorError::io(path))?;
    drop(file);
    let file = OpenOptions::new()
        .append(true)
        .open(path)
        .map_err(ActorError::io(path))?;
    let mut w = JournalWriter {
        path: path.to_path_buf(),
        out: BufWriter::new(file),
        records: 0,
        next_seq: s.steps,
        tokens: s.tokens,
        generated: s.generated,
    };
    let footer = TrajectoryFooter {
        outcome_reward: 0.0,
        success: false,
        termination: Termination::Abandoned,
        step_count: s.steps,
        token_count: s.tokens,
        generated_token_count: s.generated,
        wall_ms: 0,
        finished_unix_ms: unix_ms(),
        template_divergent: false,
    };
    w.footer(footer)?;
    s.footer = Some(footer);
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use corvid_proto::synthetic;

    #[test]
    fn round_trips_parts_and_seals_a_torn_journal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.traj");
        let header = synthetic::header("t-1", "hops", 1, 1);
        let mut w = JournalWriter::create(&path).unwrap();
        w.header(&header).unwrap();
        for i in 0..3 {
            w.step(Step::generated(i, vec![1, 2, 3], vec![-0.5; 3], 1))
                .unwrap();
        }
        w.flush().unwrap();
        drop(w);
        // Tear the last record in half.
        let len = std::fs::metadata(&path).unwrap().len();
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(len - 5).unwrap();
        drop(f);
        let torn = scan(&path).unwrap();
        assert_eq!(
            torn.stopped,
            Some(Stopped::Torn {
                offset: torn.valid_len
            })
        );
        let s = seal_abandoned(&path).unwrap();
        assert_eq!(s.steps, 2, "the torn step is cut");
        let again = scan(&path).unwrap();
        assert_eq!(again.header.unwrap().trajectory_id, "t-1");
        assert_eq!(again.steps, 2);
        let f = again.footer.unwrap();
        assert_eq!(f.termination, Termination::Abandoned);
        assert_eq!(
            (f.step_count, f.token_count, f.generated_token_count),
            (2, 6, 6)
        );
        let seqs: Vec<u64> = JournalReader::open(&path)
            .unwrap()
            .filter_map(|p| match p.unwrap().part {
                Some(Part::Step(c)) => Some(c.seq),
                _ => None,
            })
            .collect();
        assert_eq!(seqs, vec![0, 1]);
    }

    #[test]
    fn a_damaged_record_before_intact_ones_is_reported_and_never_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.traj");
        let mut w = JournalWriter::create(&path).unwrap();
        w.header(&synthetic::header("t-1", "hops", 1, 1)).unwrap();
        let first_step = w.records();
        for i in 0..3 {
            w.step(Step::generated(i, vec![1, 2, 3], vec![-0.5; 3], 1))
                .unwrap();
        }
        w.sync().unwrap();
        drop(w);
        assert_eq!(first_step, 1);
        let mut bytes = std::fs::read(&path).unwrap();
        let header_len = 8 + u64::from(u32::from_le_bytes(bytes[..4].try_into().unwrap()));
        // Flip a payload byte of the first step: the record is whole, its checksum fails.
        bytes[header_len as usize + 8] ^= 0x80;
        std::fs::write(&path, &bytes).unwrap();
        let s = scan(&path).unwrap();
        assert_eq!((s.steps, s.valid_len), (0, header_len));
        assert_eq!(
            s.stopped,
            Some(Stopped::Damaged {
                offset: header_len,
                why: "fails its checksum".into()
            })
        );
        let e = seal_abandoned(&path).unwrap_err().to_string();
        assert!(
            e.contains(&format!("record at offset {header_len} fails its checksum")),
            "{e}"
        );
        assert_eq!(
            std::fs::read(&path).unwrap(),
            bytes,
            "the file is untouched"
        );
    }
}
