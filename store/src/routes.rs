//! Route files: a trajectory's recorded routes, kept beside sled's tree instead of in it.
//!
//! A large MoE's routes are 40–60× the rest of a token (464 bytes per token for
//! DeepSeek-V3's shape). Written into sled's tree they held 150–255 MB of the learner's
//! memory during one ingest stream, whatever sled's cache budget; written to a file they pass
//! through the kernel's page cache (`BENCHMARKS.md`, "Trajectory ingest"). A file costs a
//! second fsync at finish (13–15 ms on the dev VM, a journal commit however few its bytes),
//! so routes of fewer than [`FILE_BYTES_PER_TOKEN`] bytes per token stay in their steps.
//! From it up, a trajectory has one file, [`ROUTES_DIR`]`/<id>.routes`, holding one frame per
//! step in order:
//!
//! | bytes | field |
//! |---|---|
//! | 8 | the step's seq, u64 LE |
//! | 4 | length of its routes, u32 LE |
//! | 4 | CRC-32 of its routes, u32 LE |
//! | length | the step's `routes` bytes |
//!
//! and the step in the `steps` tree is stored without its `routes` field. The file and its
//! name are fsynced before the finish transaction commits, so a finished trajectory's file is
//! whole; readers put each frame back into its step.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// The folder of route files inside the store folder.
pub const ROUTES_DIR: &str = "routes";

/// Route shapes of at least this many bytes per token go to a route file: from there on
/// the routes are 4× the rest of a token or more (~7.7 bytes), and in sled's tree they
/// would hold most of the store's memory.
pub const FILE_BYTES_PER_TOKEN: usize = 32;

/// Whether a trajectory whose header declares `shape` keeps its routes in a route file.
pub(crate) fn in_file(shape: Option<corvid_proto::RouteShape>) -> bool {
    shape.is_some_and(|s| s.bytes_per_token() >= FILE_BYTES_PER_TOKEN)
}

/// The file's name ends so: never `.` or `..`, whatever the id (`[A-Za-z0-9_.-]`).
const SUFFIX: &str = ".routes";

/// Bytes before each frame's routes.
const FRAME_HEADER: usize = 16;

/// The route file of trajectory `id` in the store folder `store`.
pub(crate) fn path(store: &Path, id: &str) -> PathBuf {
    store.join(ROUTES_DIR).join(format!("{id}{SUFFIX}"))
}

/// The trajectory id a file in [`ROUTES_DIR`] belongs to; `None` for a file the store did not
/// name.
pub(crate) fn id_of(file_name: &str) -> Option<&str> {
    file_name
        .strip_suffix(SUFFIX)
        .filter(|id| corvid_proto::validate_trajectory_id(id).is_ok())
}

/// The bytes of the route files in the store folder `store` (0 without a route folder).
pub(crate) fn folder_bytes(store: &Path) -> io::Result<u64> {
    let dir = match std::fs::read_dir(store.join(ROUTES_DIR)) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        dir => dir?,
    };
    let mut bytes = 0;
    for entry in dir {
        bytes += entry?.metadata()?.len();
    }
    Ok(bytes)
}

/// Appends frames to a trajectory's route file.
#[derive(Debug)]
pub(crate) struct RouteWriter {
    file: BufWriter<File>,
    path: PathBuf,
}

impl RouteWriter {
    /// Creates the file at `path`, which must not exist: the store removes an unfinished
    /// trajectory's file before its id is begun again, so one there belongs to another id (a
    /// case-insensitive file system) and is never emptied.
    pub fn create(path: PathBuf) -> io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)?;
        let file = BufWriter::with_capacity(64 << 10, file);
        Ok(Self { file, path })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends step `seq`'s routes.
    pub fn append(&mut self, seq: u64, routes: &[u8]) -> io::Result<()> {
        let len = u32::try_from(routes.len())
            .map_err(|_| io::Error::other(format!("{} route bytes in one step", routes.len())))?;
        let mut header = [0u8; FRAME_HEADER];
        header[..8].copy_from_slice(&seq.to_le_bytes());
        header[8..12].copy_from_slice(&len.to_le_bytes());
        header[12..].copy_from_slice(&crc32fast::hash(routes).to_le_bytes());
        self.file.write_all(&header)?;
        self.file.write_all(routes)
    }

    /// Drops what is buffered without writing it: for a writer whose file is being removed.
    pub fn discard(self) {
        drop(self.file.into_parts());
    }

    /// Makes everything appended durable, the file's name included.
    pub fn sync(&mut self) -> io::Result<()> {
        self.file.flush()?;
        self.file.get_ref().sync_data()?;
        match self.path.parent() {
            Some(dir) => corvid_durable::sync_dir(dir),
            None => Ok(()),
        }
    }
}

/// Reads a trajectory's route file back, frame by frame.
#[derive(Debug)]
pub(crate) struct RouteReader {
    file: BufReader<File>,
    path: PathBuf,
}

impl RouteReader {
    /// Opens the file at `path`.
    pub fn open(path: &Path) -> Result<Self, String> {
        File::open(path)
            .map(|f| Self {
                file: BufReader::with_capacity(64 << 10, f),
                path: path.to_path_buf(),
            })
            .map_err(|e| format!("its routes file {}: {e}", path.display()))
    }

    /// Step `seq`'s routes: the next frame, which must be `seq`'s and whole.
    pub fn next(&mut self, seq: u64) -> Result<Vec<u8>, String> {
        let file = self.path.display().to_string();
        let cut = |e: io::Error| match e.kind() {
            io::ErrorKind::UnexpectedEof => {
                format!("step chunk seq {seq}: the routes file {file} ends before its routes")
            }
            _ => format!("step chunk seq {seq}: reading its routes from {file}: {e}"),
        };
        let mut header = [0u8; FRAME_HEADER];
        self.file.read_exact(&mut header).map_err(cut)?;
        let word = |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().expect("4 bytes"));
        let found = u64::from_le_bytes(header[..8].try_into().expect("8 bytes"));
        if found != seq {
            return Err(format!(
                "step chunk seq {seq}: the routes file {file} holds step chunk seq {found}'s routes in its place"
            ));
        }
        let len = word(8) as usize;
        // No step's routes exceed a chunk: a larger length is damage, not an allocation.
        if len > corvid_proto::limits::MAX_STEP_CHUNK_BYTES {
            return Err(format!(
                "step chunk seq {seq}: the routes file {file} claims {len} route bytes"
            ));
        }
        let mut routes = vec![0; len];
        self.file.read_exact(&mut routes).map_err(cut)?;
        if crc32fast::hash(&routes) != word(12) {
            return Err(format!(
                "step chunk seq {seq}: its routes fail their checksum in the routes file {file}"
            ));
        }
        Ok(routes)
    }

    /// Checks that no frame is left after the last step's.
    pub fn end(&mut self, steps: u64) -> Result<(), String> {
        let mut byte = [0u8; 1];
        match self.file.read(&mut byte) {
            Ok(0) => Ok(()),
            Ok(_) => Err(format!(
                "the routes file {} holds more than its {steps} steps' routes",
                self.path.display()
            )),
            Err(e) => Err(format!(
                "reading its routes file {}: {e}",
                self.path.display()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(frames: &[(u64, &[u8])]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.routes");
        let mut w = RouteWriter::create(path.clone()).unwrap();
        for (seq, routes) in frames {
            w.append(*seq, routes).unwrap();
        }
        w.sync().unwrap();
        (dir, path)
    }

    #[test]
    fn frames_read_back_in_order_and_the_end_is_checked() {
        let big = vec![7u8; 200_000];
        let (_dir, path) = written(&[(0, &[1, 2, 3]), (1, &[]), (2, &big)]);
        let mut r = RouteReader::open(&path).unwrap();
        assert_eq!(r.next(0).unwrap(), [1, 2, 3]);
        assert_eq!(r.next(1).unwrap(), Vec::<u8>::new());
        assert_eq!(r.next(2).unwrap(), big);
        r.end(3).unwrap();
        let mut r = RouteReader::open(&path).unwrap();
        r.next(0).unwrap();
        let err = r.end(1).unwrap_err();
        assert!(err.contains("more than its 1 steps"), "{err}");
    }

    #[test]
    fn damage_is_named_with_its_step() {
        let (_dir, path) = written(&[(0, &[1, 2, 3]), (1, &[4, 5])]);
        let bytes = std::fs::read(&path).unwrap();
        let cases: [(&str, Vec<u8>); 3] = [
            ("ends before", bytes[..bytes.len() - 1].to_vec()),
            ("checksum", {
                let mut b = bytes.clone();
                *b.last_mut().unwrap() ^= 1;
                b
            }),
            ("seq 0's routes in its place", {
                let mut b = bytes.clone();
                b[FRAME_HEADER + 3] = 0; // frame 1's seq byte becomes 0
                b
            }),
        ];
        for (what, damaged) in cases {
            std::fs::write(&path, &damaged).unwrap();
            let mut r = RouteReader::open(&path).unwrap();
            r.next(0).unwrap();
            let err = r.next(1).unwrap_err();
            assert!(
                err.contains("step chunk seq 1") && err.contains(what),
                "{err}"
            );
        }
        let err = RouteReader::open(&path.with_extension("gone")).unwrap_err();
        assert!(err.contains("its routes file"), "{err}");
        // A file already there is never emptied.
        let before = std::fs::read(&path).unwrap();
        let err = RouteWriter::create(path.clone()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&path).unwrap(), before);
    }

    #[test]
    fn only_names_the_store_gives_are_taken_for_route_files() {
        assert_eq!(id_of("r1-t0.routes"), Some("r1-t0"));
        assert_eq!(id_of("..routes"), Some("."));
        assert_eq!(id_of("notes.txt"), None);
        assert_eq!(id_of("a b.routes"), None);
        assert_eq!(
            path(Path::new("/s"), "."),
            Path::new("/s/routes/..routes").to_path_buf()
        );
    }
}
