//! Reading the store: get, stream steps, list with filters, export, stats, and
//! the trainer's cursor. Every reader sees finished trajectories only.

use std::collections::BTreeMap;
use std::io::Write;

use corvid_proto::{pb, Step, Termination, Trajectory};
use prost::Message;
use serde::Serialize;

use super::keys;
use super::routes::{self, RouteReader};
use super::{RecordStatus, Result, StoreError, TrajectoryRecord, TrajectoryStore};

/// Which trajectories to list or export. Empty fields match everything.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Task family.
    pub family: Option<String>,
    /// Task level (with or without a family).
    pub level: Option<u32>,
    /// Checker verdict.
    pub success: Option<bool>,
    /// Lowest policy version at the start of the episode.
    pub min_policy_version: Option<u64>,
    /// Highest policy version at the start of the episode.
    pub max_policy_version: Option<u64>,
    /// How the episode ended.
    pub termination: Option<Termination>,
    /// Stop after this many matches.
    pub limit: Option<usize>,
}

impl Filter {
    /// Whether a finished record matches.
    pub fn matches(&self, r: &TrajectoryRecord) -> bool {
        let h = &r.header;
        let Some(f) = &r.footer else { return false };
        self.family.as_ref().is_none_or(|x| *x == h.task.family)
            && self.level.is_none_or(|x| x == h.task.level)
            && self.success.is_none_or(|x| x == f.success)
            && self
                .min_policy_version
                .is_none_or(|x| h.policy_version >= x)
            && self
                .max_policy_version
                .is_none_or(|x| h.policy_version <= x)
            && self.termination.is_none_or(|x| x == f.termination)
    }
}

/// Counts over the whole store.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StoreStats {
    /// Finished (visible) trajectories.
    pub finished: u64,
    /// Trajectories being written right now.
    pub open: u64,
    /// Finished trajectories the trainer has consumed.
    pub consumed: u64,
    /// Finished trajectories whose checker accepted the result.
    pub succeeded: u64,
    /// Steps of finished trajectories.
    pub steps: u64,
    /// Tokens of finished trajectories.
    pub tokens: u64,
    /// Generated tokens of finished trajectories.
    pub generated_tokens: u64,
    /// Finished trajectories per termination.
    pub by_termination: BTreeMap<String, u64>,
    /// Finished trajectories per `family/level`.
    pub by_task: BTreeMap<String, u64>,
    /// Size of the store on disk (sled's files and the route files), bytes.
    pub disk_bytes: u64,
}

/// What an export wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ExportSummary {
    /// Trajectories (lines) written.
    pub trajectories: u64,
    /// Steps written.
    pub steps: u64,
    /// Tokens written.
    pub tokens: u64,
}

type RecordIter<'a> = Box<dyn Iterator<Item = Result<TrajectoryRecord>> + 'a>;

impl TrajectoryStore {
    /// The record of a finished trajectory; `None` if unknown or unfinished.
    pub fn get(&self, id: &str) -> Result<Option<TrajectoryRecord>> {
        Ok(self
            .record(id)?
            .filter(|r| r.status == RecordStatus::Finished))
    }

    /// The finished trajectory `id`, read whole, with its place in the finish order (`None`
    /// for a record from before the store kept one); `None` if `id` is not finished. Its steps
    /// must add up to its footer's counts.
    pub fn load(&self, id: &str) -> Result<Option<(Option<u64>, Trajectory)>> {
        let Some(rec) = self.get(id)? else {
            return Ok(None);
        };
        let Some(footer) = rec.footer else {
            return Ok(None);
        };
        let Some(steps) = self.steps(id)? else {
            return Ok(None);
        };
        let trajectory = Trajectory {
            header: rec.header,
            steps: steps.collect::<Result<Vec<_>>>()?,
            footer,
        };
        let (steps, tokens) = (trajectory.steps.len() as u64, trajectory.len() as u64);
        if (steps, tokens) != (footer.step_count, footer.token_count) {
            return Err(StoreError::Corrupt {
                id: id.to_owned(),
                reason: format!(
                    "{steps} steps of {tokens} tokens stored, but its footer counts {} of {}",
                    footer.step_count, footer.token_count
                ),
            });
        }
        Ok(Some((rec.finish_seq, trajectory)))
    }

    /// Streams the steps of a finished trajectory in order, one decoded step at a
    /// time (its pieces joined); `None` if unknown or unfinished. The stream ends after
    /// its first error.
    pub fn steps(&self, id: &str) -> Result<Option<impl Iterator<Item = Result<Step>> + '_>> {
        let Some(rec) = self.get(id)? else {
            return Ok(None);
        };
        let owned_id = id.to_owned();
        let corrupt = move |reason: String| StoreError::Corrupt {
            id: owned_id.clone(),
            reason,
        };
        let mut routes = match rec.routes_in_file {
            true => Some(RouteReader::open(&routes::path(&self.path, id)).map_err(&corrupt)?),
            false => None,
        };
        let first_len = keys::step_key(id, 0).len();
        let mut entries = self.steps.scan_prefix(keys::step_prefix(id)).peekable();
        let (mut failed, mut read) = (false, 0u64);
        Ok(Some(std::iter::from_fn(move || {
            if failed {
                return None;
            }
            let Some(step) = self.next_step(&mut entries, first_len, &corrupt, routes.as_mut())
            else {
                // After the last step, no routes may be left over.
                let end = routes.take().map(|mut r| r.end(read));
                failed = true;
                return end?.err().map(|reason| Err(corrupt(reason)));
            };
            failed = step.is_err();
            read += 1;
            Some(step)
        })))
    }

    /// The next step of a trajectory's `entries` (its first piece's key is `first_len`
    /// bytes long): its pieces, which sort right after the first under the first's key and a
    /// number, joined and decoded.
    fn next_step(
        &self,
        entries: &mut std::iter::Peekable<sled::Iter>,
        first_len: usize,
        corrupt: &dyn Fn(String) -> StoreError,
        routes: Option<&mut RouteReader>,
    ) -> Option<Result<Step>> {
        let (key, first) = match entries.next()? {
            Ok(kv) => kv,
            Err(e) => return Some(Err(self.sled_err(e))),
        };
        let Some(seq) = key
            .get(first_len - 8..)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .filter(|_| key.len() == first_len)
            .map(u64::from_be_bytes)
        else {
            return Some(Err(corrupt(format!(
                "a step piece without its first piece (key of {} bytes)",
                key.len()
            ))));
        };
        let mut bytes = first.to_vec();
        let mut want = 1u32;
        loop {
            match entries.peek() {
                Some(Ok((next, _))) if next.len() != first_len && next.starts_with(&key) => {}
                // A read error inside the step: never decode what was read before it.
                Some(Err(_)) => {
                    let e = entries.next()?.err()?;
                    return Some(Err(self.sled_err(e)));
                }
                _ => break,
            }
            let (next, piece) = entries.next()?.ok()?;
            if next[first_len..] != want.to_be_bytes() {
                return Some(Err(corrupt(format!(
                    "step chunk seq {seq}: piece {want} is missing"
                ))));
            }
            bytes.extend_from_slice(&piece);
            want += 1;
        }
        let step = pb::Step::decode(bytes.as_slice())
            .map_err(|e| corrupt(format!("step chunk seq {seq}: {e}")))
            .and_then(|mut wire| {
                if let Some(file) = routes {
                    if !wire.routes.is_empty() {
                        return Err(corrupt(format!(
                            "step chunk seq {seq}: its routes are both in the step and in its routes file"
                        )));
                    }
                    wire.routes = file.next(seq).map_err(corrupt)?;
                }
                Step::try_from(wire).map_err(|e| corrupt(format!("step chunk seq {seq}: {e}")))
            });
        Some(step)
    }

    /// Finished trajectories matching `filter`, using the most selective index.
    pub fn list<'a>(&'a self, filter: &'a Filter) -> RecordIter<'a> {
        let ids: Box<dyn Iterator<Item = Result<String>> + 'a> =
            if let Some(family) = &filter.family {
                let prefix = keys::task_prefix(family, filter.level);
                Box::new(self.by_task.scan_prefix(prefix).keys().map(move |k| {
                    let k = k.map_err(|e| self.sled_err(e))?;
                    let n = keys::task_prefix_len(&k).unwrap_or(k.len());
                    Ok(keys::id_after(&k, n).unwrap_or_default())
                }))
            } else if let Some(t) = filter.termination {
                let prefix = keys::status_prefix(t, filter.success);
                Box::new(self.by_status.scan_prefix(prefix).keys().map(move |k| {
                    let k = k.map_err(|e| self.sled_err(e))?;
                    Ok(keys::id_after(&k, 2).unwrap_or_default())
                }))
            } else if filter.min_policy_version.is_some() || filter.max_policy_version.is_some() {
                let lo = filter
                    .min_policy_version
                    .unwrap_or(0)
                    .to_be_bytes()
                    .to_vec();
                let range = match filter.max_policy_version.and_then(|v| v.checked_add(1)) {
                    Some(hi) => self.by_version.range(lo..hi.to_be_bytes().to_vec()),
                    None => self.by_version.range(lo..),
                };
                Box::new(range.keys().map(move |k| {
                    let k = k.map_err(|e| self.sled_err(e))?;
                    Ok(keys::id_after(&k, 8).unwrap_or_default())
                }))
            } else {
                Box::new(self.by_seq.iter().values().map(move |v| {
                    let v = v.map_err(|e| self.sled_err(e))?;
                    Ok(String::from_utf8_lossy(&v).into_owned())
                }))
            };
        let records = ids.filter_map(move |id| match id.and_then(|id| self.get(&id)) {
            Ok(Some(r)) if filter.matches(&r) => Some(Ok(r)),
            Ok(_) => None,
            Err(e) => Some(Err(e)),
        });
        match filter.limit {
            Some(n) => Box::new(records.take(n)),
            None => Box::new(records),
        }
    }

    /// Finished trajectories in finish order after `cursor` (exclusive), with their
    /// position. The trainer keeps the last position it read as its cursor; 0 reads
    /// from the start.
    pub fn finished_since(
        &self,
        cursor: u64,
    ) -> impl Iterator<Item = Result<(u64, TrajectoryRecord)>> + '_ {
        let start = cursor.saturating_add(1).to_be_bytes();
        self.by_seq.range(start..).filter_map(move |kv| {
            let (k, v) = match kv {
                Ok(kv) => kv,
                Err(e) => return Some(Err(self.sled_err(e))),
            };
            let seq = <[u8; 8]>::try_from(k.as_ref())
                .map(u64::from_be_bytes)
                .ok()?;
            let id = String::from_utf8_lossy(&v).into_owned();
            match self.get(&id) {
                Ok(Some(r)) => Some(Ok((seq, r))),
                Ok(None) => None,
                Err(e) => Some(Err(e)),
            }
        })
    }

    /// Writes matching trajectories as JSON lines, one trajectory per line:
    /// `{"header":…,"footer":…,"stored_unix_ms":…,"steps":[…]}` with the field
    /// names of `corvid_proto::types`. Steps are streamed, never collected.
    pub fn export_jsonl(&self, filter: &Filter, out: &mut dyn Write) -> Result<ExportSummary> {
        let io = |source| StoreError::Io {
            what: "writing the export".into(),
            source,
        };
        let mut summary = ExportSummary::default();
        for rec in self.list(filter) {
            let rec = rec?;
            let id = rec.header.trajectory_id.clone();
            write!(
                out,
                "{{\"header\":{},\"footer\":{},\"stored_unix_ms\":{},\"steps\":[",
                json(&rec.header),
                json(&rec.footer),
                rec.stored_unix_ms
            )
            .map_err(io)?;
            if let Some(steps) = self.steps(&id)? {
                for (i, step) in steps.enumerate() {
                    let step = step?;
                    summary.steps += 1;
                    summary.tokens += step.token_ids.len() as u64;
                    if i > 0 {
                        out.write_all(b",").map_err(io)?;
                    }
                    out.write_all(json(&step).as_bytes()).map_err(io)?;
                }
            }
            out.write_all(b"]}\n").map_err(io)?;
            summary.trajectories += 1;
        }
        out.flush().map_err(io)?;
        Ok(summary)
    }

    /// Counts over the whole store (scans the records, not the steps).
    pub fn stats(&self) -> Result<StoreStats> {
        let mut s = StoreStats {
            open: self.open.len() as u64,
            disk_bytes: self.db.size_on_disk().map_err(|e| self.sled_err(e))?
                + routes::folder_bytes(&self.path).map_err(|source| StoreError::Io {
                    what: format!("listing {}", self.path.join(routes::ROUTES_DIR).display()),
                    source,
                })?,
            ..StoreStats::default()
        };
        for kv in self.meta.iter() {
            let (k, v) = kv.map_err(|e| self.sled_err(e))?;
            let id = String::from_utf8_lossy(&k).into_owned();
            let r = TrajectoryRecord::decode(&id, &v)?;
            let Some(f) = r.footer.filter(|_| r.status == RecordStatus::Finished) else {
                continue;
            };
            s.finished += 1;
            s.succeeded += u64::from(f.success);
            s.steps += f.step_count;
            s.tokens += f.token_count;
            s.generated_tokens += f.generated_token_count;
            *s.by_termination
                .entry(f.termination.to_string())
                .or_default() += 1;
            *s.by_task
                .entry(format!("{}/{}", r.header.task.family, r.header.task.level))
                .or_default() += 1;
            if self.consumed_at(&id)?.is_some() {
                s.consumed += 1;
            }
        }
        Ok(s)
    }
}

/// JSON of plain data, where serialising cannot fail.
fn json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use corvid_proto::synthetic::{self, Shape};
    use corvid_proto::{RouteShape, Step, TrajectoryFooter};
    use prost::Message;

    use crate::{keys, routes, Begin, TrajectoryRecord, TrajectoryStore, STEP_PIECE_BYTES};

    const SHAPE: Shape = Shape {
        steps: 2,
        tokens_per_step: 4000,
    };
    const ROUTES: RouteShape = RouteShape {
        moe_layers: 16,
        experts_per_token: 4,
        routed_experts: 64,
    };

    /// A finished trajectory `t` whose steps are each several pieces long.
    fn stored() -> (tempfile::TempDir, Arc<TrajectoryStore>, Vec<Step>) {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(TrajectoryStore::open(dir.path().join("s")).unwrap());
        let steps: Vec<Step> = synthetic::routed_steps("t", SHAPE, ROUTES).collect();
        let mut header = synthetic::header("t", "hops", 1, 1);
        header.routes = Some(ROUTES);
        let Begin::New(mut w) = store.begin(header).unwrap() else {
            panic!("new")
        };
        for (seq, s) in steps.iter().enumerate() {
            w.append(seq as u64, s.clone()).unwrap();
        }
        w.finish_blocking(synthetic::footer("t", SHAPE)).unwrap();
        (dir, store, steps)
    }

    fn encoded(s: &Step) -> Vec<u8> {
        corvid_proto::pb::Step::from(s.clone()).encode_to_vec()
    }

    #[test]
    fn a_step_stored_whole_reads_like_one_stored_in_pieces() {
        let (_dir, store, steps) = stored();
        // Its routes are in the route file.
        let whole = encoded(&Step {
            routes: vec![],
            ..steps[1].clone()
        });
        assert!(whole.len() > 3 * STEP_PIECE_BYTES);
        // The layout of a store written before pieces: one value per step.
        for key in store.steps.scan_prefix(keys::step_key("t", 1)).keys() {
            store.steps.remove(key.unwrap()).unwrap();
        }
        store.steps.insert(keys::step_key("t", 1), whole).unwrap();
        let (_, t) = store.load("t").unwrap().unwrap();
        assert!(
            t.steps == steps,
            "the step stored whole reads back as written"
        );
    }

    #[test]
    fn a_missing_piece_is_reported_with_its_step() {
        let (_dir, store, _) = stored();
        store.steps.remove(keys::piece_key("t", 1, 2)).unwrap();
        let Err(err) = store.load("t") else {
            panic!("a step with a piece missing was read")
        };
        let err = err.to_string();
        assert!(
            err.contains("step chunk seq 1: piece 2 is missing"),
            "{err}"
        );
        let read: Vec<_> = store.steps("t").unwrap().unwrap().collect();
        assert_eq!(read.len(), 2, "the stream ends at its first error");
        assert!(read[0].is_ok() && read[1].is_err());
    }

    #[test]
    fn steps_that_do_not_add_up_to_the_footer_are_reported() {
        let (_dir, store, steps) = stored();
        let mut rec = store.get("t").unwrap().unwrap();
        rec.footer = Some(TrajectoryFooter {
            token_count: 7,
            ..rec.footer.unwrap()
        });
        store.meta.insert("t", rec.encode()).unwrap();
        let Err(err) = store.load("t") else {
            panic!("steps that do not add up were read")
        };
        let err = err.to_string();
        assert!(
            err.contains(&format!("{} steps of 8000 tokens", steps.len())),
            "{err}"
        );
        assert!(err.contains("footer counts 2 of 7"), "{err}");
    }

    /// The layout of a store written before route files: each step whole in `steps`, routes
    /// included, and a record that does not point at a route file.
    fn without_route_file(store: &TrajectoryStore, steps: &[Step]) {
        for (seq, s) in steps.iter().enumerate() {
            for key in store
                .steps
                .scan_prefix(keys::step_key("t", seq as u64))
                .keys()
            {
                store.steps.remove(key.unwrap()).unwrap();
            }
            store
                .steps
                .insert(keys::step_key("t", seq as u64), encoded(s))
                .unwrap();
        }
        let rec = TrajectoryRecord {
            routes_in_file: false,
            ..store.get("t").unwrap().unwrap()
        };
        store.meta.insert("t", rec.encode()).unwrap();
        std::fs::remove_file(routes::path(store.path(), "t")).unwrap();
    }

    #[test]
    fn routes_stored_in_their_steps_read_back_as_before() {
        let (_dir, store, steps) = stored();
        without_route_file(&store, &steps);
        let (_, t) = store.load("t").unwrap().unwrap();
        assert!(t.steps == steps, "routes read from the steps themselves");
    }

    #[test]
    fn a_damaged_or_missing_route_file_is_reported_with_its_step() {
        let (_dir, store, steps) = stored();
        let path = routes::path(store.path(), "t");
        let bytes = std::fs::read(&path).unwrap();
        let damaged = |b: &[u8]| {
            std::fs::write(&path, b).unwrap();
            store.load("t").unwrap_err().to_string()
        };
        let err = damaged(&bytes[..bytes.len() - 10]);
        assert!(
            err.contains("step chunk seq 1: the routes file")
                && err.contains("ends before its routes"),
            "{err}"
        );
        let mut flipped = bytes.clone();
        flipped[40] ^= 4;
        let err = damaged(&flipped);
        assert!(
            err.contains("step chunk seq 0: its routes fail their checksum"),
            "{err}"
        );
        let err = damaged(&[&bytes[..], &[0]].concat());
        assert!(err.contains("more than its 2 steps' routes"), "{err}");
        std::fs::remove_file(&path).unwrap();
        let Err(err) = store.steps("t") else {
            panic!("a trajectory without its route file was read")
        };
        assert!(err.to_string().contains("its routes file"), "{err}");
        // A step that still holds routes where the record points at a route file.
        std::fs::write(&path, &bytes).unwrap();
        store
            .steps
            .insert(keys::step_key("t", 0), encoded(&steps[0]))
            .unwrap();
        for key in store
            .steps
            .scan_prefix(keys::step_key("t", 0))
            .keys()
            .skip(1)
        {
            store.steps.remove(key.unwrap()).unwrap();
        }
        let err = store.load("t").unwrap_err().to_string();
        assert!(
            err.contains(
                "step chunk seq 0: its routes are both in the step and in its routes file"
            ),
            "{err}"
        );
    }
}
