//! Change detection for the post-call quota check.
//!
//! WASI has no disk quota, so the host measures the workspace after every
//! call that can write. A full walk costs one `stat` per entry (about 60 µs
//! for a 20-file workspace, half of a whole `cat` call). The kernel already
//! knows whether anything changed: an inotify watch on every directory of a
//! workspace reports each create, delete, rename, hard link and content change
//! (write, truncate, fallocate) made through that directory, and queues the
//! event before the guest's syscall returns. So after a call the host drains
//! the queue; when no event touched the workspace since it was last measured,
//! that measurement still holds and the walk is skipped.
//!
//! The guest cannot suppress this: events come from the kernel's VFS, not from
//! anything the guest or wasmtime-wasi reports. Whenever the watcher cannot
//! vouch for a workspace — inotify unavailable (not Linux, or the per-user
//! instance limit reached), a watch that could not be added (watch limit, a
//! path too long), a queue overflow, a watch removed by the kernel — the check
//! falls back to a full walk, which is what it always did before.
//!
//! One inotify instance serves the whole [`crate::Sandbox`] (the default
//! per-user limit is 128 instances, fewer than the episodes an actor runs).
//! Its event queue is shared: whichever call drains it marks every workspace
//! the events belong to, so a call sees the writes of its own guest even when
//! another worker drained them first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::workspace::{walk, Kind, Usage, Workspace};
use crate::SandboxError;

/// One inotify instance and the workspaces whose directories it watches.
pub(crate) struct Watcher {
    inner: Mutex<Inner>,
}

/// A workspace's registration with a [`Watcher`] and the usage measured
/// when the workspace was last known unchanged. Dropping it removes the
/// workspace's watches.
pub(crate) struct Registration {
    watcher: Arc<Watcher>,
    id: u64,
    usage: Usage,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.watcher.lock().unregister(self.id);
    }
}

/// What the watcher knows about one registered workspace.
#[derive(Default)]
struct Watched {
    /// Watch descriptors of its directories.
    wds: Vec<i32>,
    /// An event touched it since it was last measured (or it never was).
    dirty: bool,
    /// Every directory found by the last walk got a watch.
    complete: bool,
}

struct Inner {
    os: os::Inotify,
    /// Watch descriptor → registered workspaces (two attached workspaces may
    /// share a directory, and then its watch).
    by_wd: HashMap<i32, Vec<u64>>,
    by_ws: HashMap<u64, Watched>,
    next_id: u64,
}

impl Inner {
    /// Reads every queued event and marks the workspaces they belong to.
    fn drain(&mut self) {
        let Inner {
            os, by_wd, by_ws, ..
        } = self;
        os.drain(&mut |ev| match ev {
            os::Event::Changed(wd) => {
                for id in by_wd.get(&wd).into_iter().flatten() {
                    if let Some(w) = by_ws.get_mut(id) {
                        w.dirty = true;
                    }
                }
            }
            // The directory is gone (or its watch was removed): forget the
            // descriptor; its owners walk again and re-add what exists.
            os::Event::Removed(wd) => {
                for id in by_wd.remove(&wd).unwrap_or_default() {
                    if let Some(w) = by_ws.get_mut(&id) {
                        w.dirty = true;
                        w.wds.retain(|&x| x != wd);
                    }
                }
            }
            // Events were lost (queue overflow or a read error): trust nothing.
            os::Event::Lost => by_ws.values_mut().for_each(|w| w.dirty = true),
        });
    }

    fn unregister(&mut self, id: u64) {
        let Some(w) = self.by_ws.remove(&id) else {
            return;
        };
        for wd in w.wds {
            if let Some(owners) = self.by_wd.get_mut(&wd) {
                owners.retain(|&x| x != id);
                if owners.is_empty() {
                    self.by_wd.remove(&wd);
                    self.os.remove_watch(wd);
                }
            }
        }
    }
}

impl Watcher {
    /// A watcher, or `None` where inotify is unavailable (the quota check
    /// then walks after every writing call).
    pub fn new() -> Option<Arc<Self>> {
        let os = os::Inotify::new()?;
        Some(Arc::new(Self {
            inner: Mutex::new(Inner {
                os,
                by_wd: HashMap::new(),
                by_ws: HashMap::new(),
                next_id: 0,
            }),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes and entries in `ws` now (symlinks not followed): the usage
    /// measured last time when no event touched the workspace since, else a
    /// fresh walk (which also watches directories the guest created).
    pub fn usage(self: &Arc<Self>, ws: &mut Workspace) -> Result<Usage, SandboxError> {
        let mut g = self.lock();
        g.drain();
        let mine = ws
            .watch
            .as_ref()
            .filter(|r| Arc::ptr_eq(&r.watcher, self) && g.by_ws.contains_key(&r.id));
        let id = match mine {
            Some(r) => {
                let w = &g.by_ws[&r.id];
                if w.complete && !w.dirty {
                    return Ok(r.usage);
                }
                r.id
            }
            None => {
                let id = g.next_id;
                g.next_id += 1;
                g.by_ws.insert(id, Watched::default());
                id
            }
        };
        // Clear before measuring: an event that lands during the walk (only
        // possible for two workspaces attached to one directory) marks the
        // workspace again, so the next check walks again.
        if let Some(w) = g.by_ws.get_mut(&id) {
            w.dirty = false;
        }
        drop(g);
        let mut dirs = vec![String::new()];
        let mut u = Usage::default();
        let walked = walk(&ws.dir, "", 0, &mut |path, kind, len| {
            u.inodes += 1;
            match kind {
                Kind::File => u.bytes += len,
                Kind::Dir => dirs.push(path.to_string()),
                Kind::Symlink | Kind::Other => {}
            }
            Ok(())
        });
        let mut g = self.lock();
        let Inner {
            os, by_wd, by_ws, ..
        } = &mut *g;
        let Some(w) = by_ws.get_mut(&id) else {
            return walked.map(|()| u);
        };
        if let Err(e) = walked {
            w.dirty = true;
            return Err(e);
        }
        w.complete = true;
        for d in &dirs {
            match os.add_watch(&ws.ws_host.join(d)) {
                Some(wd) => {
                    let owners = by_wd.entry(wd).or_default();
                    if !owners.contains(&id) {
                        owners.push(id);
                    }
                    if !w.wds.contains(&wd) {
                        w.wds.push(wd);
                    }
                }
                None => w.complete = false,
            }
        }
        drop(g);
        match &mut ws.watch {
            Some(r) if r.id == id && Arc::ptr_eq(&r.watcher, self) => r.usage = u,
            slot => {
                *slot = Some(Registration {
                    watcher: self.clone(),
                    id,
                    usage: u,
                })
            }
        }
        Ok(u)
    }

    #[cfg(test)]
    fn watched(&self) -> usize {
        self.lock().by_ws.len()
    }
}

#[cfg(target_os = "linux")]
mod os {
    use std::mem::MaybeUninit;
    use std::os::fd::OwnedFd;
    use std::path::Path;

    use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
    use rustix::io::Errno;

    /// What one queued event means for the workspaces.
    pub enum Event {
        /// Something under this watched directory was created, deleted,
        /// renamed or written.
        Changed(i32),
        /// This watch is gone (directory deleted, or watch removed).
        Removed(i32),
        /// Events were dropped.
        Lost,
    }

    pub struct Inotify {
        fd: OwnedFd,
        buf: Vec<MaybeUninit<u8>>,
    }

    /// Every event that can change bytes or entries below a directory.
    fn mask() -> WatchFlags {
        WatchFlags::MODIFY
            | WatchFlags::CREATE
            | WatchFlags::DELETE
            | WatchFlags::MOVED_FROM
            | WatchFlags::MOVED_TO
            | WatchFlags::DELETE_SELF
            | WatchFlags::MOVE_SELF
            | WatchFlags::ONLYDIR
            | WatchFlags::DONT_FOLLOW
    }

    impl Inotify {
        pub fn new() -> Option<Self> {
            let fd = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK).ok()?;
            Some(Self {
                fd,
                // Room for many events per read(2); each is 16 bytes + name.
                buf: vec![MaybeUninit::uninit(); 16 << 10],
            })
        }

        /// Watches a directory (a symlink is not followed); `None` if the
        /// kernel refused (watch limit, path too long, not a directory).
        pub fn add_watch(&self, dir: &Path) -> Option<i32> {
            inotify::add_watch(&self.fd, dir, mask()).ok()
        }

        pub fn remove_watch(&self, wd: i32) {
            let _ = inotify::remove_watch(&self.fd, wd);
        }

        pub fn drain(&mut self, f: &mut dyn FnMut(Event)) {
            let mut reader = inotify::Reader::new(&self.fd, &mut self.buf);
            loop {
                match reader.next() {
                    Ok(ev) => {
                        let flags = ev.events();
                        if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
                            f(Event::Lost);
                        } else if flags.contains(ReadFlags::IGNORED) {
                            f(Event::Removed(ev.wd()));
                        } else {
                            f(Event::Changed(ev.wd()));
                        }
                    }
                    Err(Errno::AGAIN) => return,
                    Err(Errno::INTR) => continue,
                    Err(_) => {
                        f(Event::Lost);
                        return;
                    }
                }
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod os {
    use std::path::Path;

    pub enum Event {
        Changed(i32),
        Removed(i32),
        Lost,
    }

    pub struct Inotify;

    impl Inotify {
        pub fn new() -> Option<Self> {
            None
        }
        pub fn add_watch(&self, _dir: &Path) -> Option<i32> {
            None
        }
        pub fn remove_watch(&self, _wd: i32) {}
        pub fn drain(&mut self, _f: &mut dyn FnMut(Event)) {}
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use crate::workspace::WorkspaceSpec;

    fn write(ws: &Workspace, rel: &str, bytes: &[u8]) {
        ws.dir.write(rel, bytes).expect("write");
    }

    #[test]
    fn cached_usage_follows_every_kind_of_change() {
        let w = Watcher::new().expect("inotify");
        let mut ws = Workspace::create(WorkspaceSpec::with_files([("a.txt", "abc")])).unwrap();
        let check = |ws: &mut Workspace| {
            let got = w.usage(ws).unwrap();
            assert_eq!(got, ws.usage().unwrap());
            got
        };
        assert_eq!(
            check(&mut ws),
            Usage {
                bytes: 3,
                inodes: 1
            }
        );
        // Unchanged: served from the cache, still right.
        assert_eq!(
            check(&mut ws),
            Usage {
                bytes: 3,
                inodes: 1
            }
        );
        write(&ws, "a.txt", b"abcdef");
        assert_eq!(check(&mut ws).bytes, 6);
        ws.dir.create_dir("d").unwrap();
        assert_eq!(check(&mut ws).inodes, 2);
        // A write inside a directory created after the first measurement.
        write(&ws, "d/f", &[0; 100]);
        assert_eq!(
            check(&mut ws),
            Usage {
                bytes: 106,
                inodes: 3
            }
        );
        // Growth without write(2): truncate up.
        let f = ws
            .dir
            .open_with("d/f", cap_std::fs::OpenOptions::new().write(true))
            .unwrap();
        f.set_len(5000).unwrap();
        drop(f);
        assert_eq!(check(&mut ws).bytes, 5006);
        ws.dir.rename("d", &ws.dir, "e").unwrap();
        write(&ws, "e/g", b"xy");
        assert_eq!(
            check(&mut ws),
            Usage {
                bytes: 5008,
                inodes: 4
            }
        );
        ws.dir.hard_link("a.txt", &ws.dir, "e/h").unwrap();
        assert_eq!(check(&mut ws).inodes, 5);
        ws.dir.remove_dir_all("e").unwrap();
        assert_eq!(
            check(&mut ws),
            Usage {
                bytes: 6,
                inodes: 1
            }
        );
        assert_eq!(w.watched(), 1);
        drop(ws);
        assert_eq!(w.watched(), 0);
    }

    #[test]
    fn a_second_watcher_takes_over_the_workspace() {
        let (a, b) = (
            Watcher::new().expect("inotify"),
            Watcher::new().expect("inotify"),
        );
        let mut ws = Workspace::create(WorkspaceSpec::with_files([("a.txt", "abc")])).unwrap();
        assert_eq!(a.usage(&mut ws).unwrap().bytes, 3);
        assert_eq!(b.usage(&mut ws).unwrap().bytes, 3);
        assert_eq!((a.watched(), b.watched()), (0, 1));
        write(&ws, "a.txt", b"");
        assert_eq!(b.usage(&mut ws).unwrap().bytes, 0);
        assert_eq!(a.usage(&mut ws).unwrap().bytes, 0);
    }
}
