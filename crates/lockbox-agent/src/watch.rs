//! File watching: one inotify instance per watch, on a path resolved inside the sandbox as
//! [`crate::files`] resolves paths; recursive watches add a watch descriptor for every
//! directory below, and for directories created later (scanning them once: what is already
//! in them is reported as created). Events wait in a bounded queue per watch until the
//! control socket takes them; beyond [`QUEUE`] events, one `overflow` event stands for all
//! that were dropped. Nothing here blocks: inotify descriptors are non-blocking, and events
//! are sent with `MSG_DONTWAIT`.
//!
//! `IN_MODIFY` is watched (so a file that a process keeps open and appends to, a log, is
//! reported while it grows) and coalesced: a `modified` event is not queued again while the
//! same path's previous `modified` is the last queued event; the kernel coalesces identical
//! consecutive events too. `IN_CLOSE_WRITE` and `IN_ATTRIB` are `modified` as well.

use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::fs::{fstat, FileType, Mode, OFlags};
use rustix::io::Errno;
use std::collections::{HashMap, VecDeque};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use crate::files::Roots;
use crate::proto::{ChangeKind, FileChange, Message, WatchEvent};

/// Most watches one agent (one sandbox) keeps at once.
pub(crate) const MAX_WATCHES: usize = 32;
/// Most inotify watch descriptors (watched directories) over all watches of a sandbox.
pub(crate) const MAX_DIRS: usize = 8192;
/// Most events queued per watch (plus one `overflow` event).
pub(crate) const QUEUE: usize = 4096;
/// Most events per message.
const BATCH: usize = 256;
/// Bytes of inotify events read per watch per turn of the loop (then other work runs).
const READ_BUDGET: usize = 256 * 1024;

fn mask() -> WatchFlags {
    WatchFlags::CREATE
        | WatchFlags::DELETE
        | WatchFlags::MOVED_FROM
        | WatchFlags::MOVED_TO
        | WatchFlags::CLOSE_WRITE
        | WatchFlags::MODIFY
        | WatchFlags::ATTRIB
        | WatchFlags::DELETE_SELF
        | WatchFlags::EXCL_UNLINK
}

/// Pushes `ev` onto a queue of at most `cap` events: beyond, the excess is counted in one
/// trailing `overflow` event. Consecutive `modified` events of one path are coalesced.
pub fn push_bounded(queue: &mut VecDeque<WatchEvent>, ev: WatchEvent, cap: usize) {
    if let (WatchEvent::Change(new), Some(WatchEvent::Change(last))) = (&ev, queue.back()) {
        if new.kind == ChangeKind::Modified
            && last.kind == ChangeKind::Modified
            && new.path == last.path
        {
            return;
        }
    }
    if let WatchEvent::Overflow { dropped: more } = ev {
        // Losses next to each other are one run of losses: one event, counts added (unknown
        // if either is).
        match queue.back_mut() {
            Some(WatchEvent::Overflow { dropped }) => {
                *dropped = dropped.zip(more).map(|(a, b)| a + b);
            }
            _ => queue.push_back(ev),
        }
        return;
    }
    if queue.len() >= cap {
        match queue.back_mut() {
            Some(WatchEvent::Overflow {
                dropped: Some(n), ..
            }) => *n += 1,
            Some(WatchEvent::Overflow { dropped: None }) => {}
            _ => queue.push_back(WatchEvent::Overflow { dropped: Some(1) }),
        }
        return;
    }
    queue.push_back(ev);
}

struct Watch {
    inotify: OwnedFd,
    recursive: bool,
    root_wd: i32,
    root_is_dir: bool,
    /// Watched directories (and the watched file): descriptor → path.
    dirs: HashMap<i32, String>,
    queue: VecDeque<WatchEvent>,
    /// `IN_MOVED_FROM` waiting for its `IN_MOVED_TO`: cookie → (path, is_dir).
    moves: Vec<(u32, String, bool)>,
    limit_reported: bool,
}

/// The watches of the agent.
#[derive(Default)]
pub(crate) struct Watches {
    watches: HashMap<u64, Watch>,
    dirs_total: usize,
}

impl Watches {
    /// Starts a watch; returns the watched path and whether it is a directory.
    pub fn add(
        &mut self,
        roots: &Roots,
        id: u64,
        path: &str,
        recursive: bool,
    ) -> Result<(String, bool), Errno> {
        if self.watches.contains_key(&id) {
            return Err(Errno::EXIST);
        }
        if self.watches.len() >= MAX_WATCHES {
            return Err(Errno::MFILE);
        }
        let (fd, display) = roots.open_path(path)?;
        let is_dir = FileType::from_raw_mode(fstat(&fd)?.st_mode) == FileType::Directory;
        let inotify = inotify::init(CreateFlags::NONBLOCK | CreateFlags::CLOEXEC)?;
        let root_wd = add_fd_watch(&inotify, &fd, &display)?;
        let mut w = Watch {
            inotify,
            recursive: recursive && is_dir,
            root_wd,
            root_is_dir: is_dir,
            dirs: HashMap::from([(root_wd, display.clone())]),
            queue: VecDeque::new(),
            moves: Vec::new(),
            limit_reported: false,
        };
        self.dirs_total += 1;
        if w.recursive {
            let dir = rustix::fs::openat(
                &fd,
                ".",
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            w.add_tree(&dir, &display, false, &mut self.dirs_total);
        }
        self.watches.insert(id, w);
        Ok((display, is_dir))
    }

    /// Stops a watch (its inotify instance closes with it).
    pub fn remove(&mut self, id: u64) {
        if let Some(w) = self.watches.remove(&id) {
            self.dirs_total = self.dirs_total.saturating_sub(w.dirs.len());
        }
    }

    /// The inotify descriptors to poll, with their watch ids.
    pub fn fds(&self) -> Vec<(u64, BorrowedFd<'_>)> {
        self.watches
            .iter()
            .map(|(id, w)| (*id, w.inotify.as_fd()))
            .collect()
    }

    /// True if some watch has events waiting to be sent.
    pub fn has_queued(&self) -> bool {
        self.watches.values().any(|w| !w.queue.is_empty())
    }

    /// Reads the events of watch `id` into its queue.
    pub fn read(&mut self, id: u64) {
        let Some(w) = self.watches.get_mut(&id) else {
            return;
        };
        w.read(&mut self.dirs_total);
    }

    /// Sends queued events without blocking; stops at the first full socket buffer. An
    /// error other than a full buffer is returned (the runtime is gone).
    pub fn flush(&mut self, ctl: BorrowedFd<'_>) -> std::io::Result<()> {
        for (id, w) in &mut self.watches {
            while !w.queue.is_empty() {
                let n = w.queue.len().min(BATCH);
                let events: Vec<WatchEvent> = w.queue.iter().take(n).cloned().collect();
                let msg = Message::WatchEvents { watch: *id, events };
                let data = serde_json::to_vec(&msg).map_err(std::io::Error::other)?;
                // BATCH paths of at most PATH_MAX fit in a record; be safe anyway.
                let (data, n) = if data.len() > crate::wire::MAX_RECORD {
                    let one = Message::WatchEvents {
                        watch: *id,
                        events: w.queue.iter().take(1).cloned().collect(),
                    };
                    (serde_json::to_vec(&one).map_err(std::io::Error::other)?, 1)
                } else {
                    (data, n)
                };
                match crate::wire::send_nowait(ctl, &data) {
                    Ok(()) => {
                        w.queue.drain(..n);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }
}

/// Adds an inotify watch on the object `fd` refers to (through `/proc/self/fd`, so the
/// path that was resolved inside the sandbox is the one watched; without `/proc`, by path).
fn add_fd_watch(inotify: &OwnedFd, fd: &OwnedFd, display: &str) -> Result<i32, Errno> {
    let flags = mask();
    match inotify::add_watch(inotify, format!("/proc/self/fd/{}", fd.as_raw_fd()), flags) {
        Err(Errno::NOENT) => inotify::add_watch(inotify, display, flags | WatchFlags::DONT_FOLLOW),
        r => r,
    }
}

impl Watch {
    fn push(&mut self, ev: WatchEvent) {
        push_bounded(&mut self.queue, ev, QUEUE);
    }

    fn change(&mut self, kind: ChangeKind, path: String, is_dir: bool, from: Option<String>) {
        self.push(WatchEvent::Change(FileChange {
            kind,
            path,
            is_dir,
            from,
        }));
    }

    /// Watches the directories below `dir` (at `display`); with `report`, also reports
    /// every entry as created (a directory that appeared after the watch started).
    fn add_tree(&mut self, dir: &OwnedFd, display: &str, report: bool, total: &mut usize) {
        let entries = match dir_entries(dir) {
            Ok(e) => e,
            Err(e) => {
                self.push(WatchEvent::Error {
                    message: format!("{display}: not watched below: {e}"),
                });
                return;
            }
        };
        for (name, is_dir) in entries {
            let path = join(display, &name);
            if report {
                self.change(ChangeKind::Created, path.clone(), is_dir, None);
            }
            if !is_dir {
                continue;
            }
            if *total >= MAX_DIRS {
                if !self.limit_reported {
                    self.limit_reported = true;
                    self.push(WatchEvent::Error {
                        message: format!(
                            "{path}: not watched: the limit of {MAX_DIRS} watched directories \
                             per sandbox is reached"
                        ),
                    });
                }
                continue;
            }
            let Ok(sub) = rustix::fs::openat(
                dir,
                name.as_str(),
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            ) else {
                continue; // gone meanwhile
            };
            match add_fd_watch(&self.inotify, &sub, &path) {
                Ok(wd) => {
                    if self.dirs.insert(wd, path.clone()).is_none() {
                        *total += 1;
                    }
                }
                Err(e) => {
                    self.push(WatchEvent::Error {
                        message: format!("{path}: not watched: {e}"),
                    });
                    continue;
                }
            }
            self.add_tree(&sub, &path, report, total);
        }
    }

    /// A directory appeared at `path` (created or moved in): watch it and what is in it.
    fn new_dir(&mut self, path: &str, total: &mut usize) {
        if *total >= MAX_DIRS {
            if !self.limit_reported {
                self.limit_reported = true;
                self.push(WatchEvent::Error {
                    message: format!(
                        "{path}: not watched: the limit of {MAX_DIRS} watched directories per \
                         sandbox is reached"
                    ),
                });
            }
            return;
        }
        // The agent's root is the sandbox's: the path is the sandbox's view.
        let Ok(dir) = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) else {
            return; // gone meanwhile
        };
        match add_fd_watch(&self.inotify, &dir, path) {
            Ok(wd) => {
                if self.dirs.insert(wd, path.to_owned()).is_none() {
                    *total += 1;
                }
            }
            Err(e) => {
                self.push(WatchEvent::Error {
                    message: format!("{path}: not watched: {e}"),
                });
                return;
            }
        }
        self.add_tree(&dir, path, true, total);
    }

    /// A watched directory moved from `from` to `to`: rename the paths below it.
    fn renamed(&mut self, from: &str, to: &str) {
        let prefix = format!("{from}/");
        for p in self.dirs.values_mut() {
            if p == from {
                *p = to.to_owned();
            } else if let Some(rest) = p.strip_prefix(&prefix) {
                *p = format!("{to}/{rest}");
            }
        }
    }

    /// A directory left the watch: stop watching below it.
    fn forget_below(&mut self, path: &str, total: &mut usize) {
        let prefix = format!("{path}/");
        let gone: Vec<i32> = self
            .dirs
            .iter()
            .filter(|(wd, p)| **wd != self.root_wd && (*p == path || p.starts_with(&prefix)))
            .map(|(wd, _)| *wd)
            .collect();
        for wd in gone {
            let _ = inotify::remove_watch(&self.inotify, wd);
            self.dirs.remove(&wd);
            *total = total.saturating_sub(1);
        }
    }

    fn read(&mut self, total: &mut usize) {
        let mut buf = vec![MaybeUninit::<u8>::uninit(); 64 * 1024];
        let mut raw: Vec<(i32, ReadFlags, u32, Option<String>)> = Vec::new();
        let mut drained = false;
        let mut read = 0;
        {
            let mut reader = inotify::Reader::new(&self.inotify, &mut buf);
            loop {
                if reader.is_buffer_empty() && read >= READ_BUDGET {
                    break;
                }
                match reader.next() {
                    Ok(ev) => {
                        read += 16 + ev.file_name().map_or(0, |n| n.to_bytes().len());
                        raw.push((
                            ev.wd(),
                            ev.events(),
                            ev.cookie(),
                            ev.file_name()
                                .map(|n| n.to_string_lossy().into_owned())
                                .filter(|n| !n.is_empty()),
                        ));
                    }
                    Err(Errno::INTR) => continue,
                    Err(_) => {
                        drained = true;
                        break;
                    }
                }
            }
        }
        for (wd, flags, cookie, name) in raw {
            self.event(wd, flags, cookie, name, total);
        }
        if drained {
            // A move whose other half is outside the watch: it left.
            for (_, path, is_dir) in std::mem::take(&mut self.moves) {
                if is_dir {
                    self.forget_below(&path, total);
                }
                self.change(ChangeKind::Deleted, path, is_dir, None);
            }
        }
    }

    fn event(
        &mut self,
        wd: i32,
        flags: ReadFlags,
        cookie: u32,
        name: Option<String>,
        total: &mut usize,
    ) {
        if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
            self.push(WatchEvent::Overflow { dropped: None });
            return;
        }
        let Some(dir) = self.dirs.get(&wd).cloned() else {
            return;
        };
        if flags.contains(ReadFlags::IGNORED) {
            if self.dirs.remove(&wd).is_some() {
                *total = total.saturating_sub(1);
            }
            return;
        }
        let is_dir = flags.contains(ReadFlags::ISDIR);
        let path = match &name {
            Some(n) => join(&dir, n),
            None => dir.clone(),
        };
        if flags.contains(ReadFlags::DELETE_SELF) {
            if wd == self.root_wd {
                self.change(ChangeKind::Deleted, path, self.root_is_dir, None);
            }
            return;
        }
        if flags.contains(ReadFlags::MOVED_FROM) {
            self.moves.push((cookie, path, is_dir));
            return;
        }
        if flags.contains(ReadFlags::MOVED_TO) {
            if let Some(i) = self.moves.iter().position(|(c, _, _)| *c == cookie) {
                let (_, from, _) = self.moves.remove(i);
                if is_dir {
                    self.renamed(&from, &path);
                }
                self.change(ChangeKind::Moved, path, is_dir, Some(from));
            } else {
                self.change(ChangeKind::Created, path.clone(), is_dir, None);
                if is_dir && self.recursive {
                    self.new_dir(&path, total);
                }
            }
            return;
        }
        if flags.contains(ReadFlags::CREATE) {
            self.change(ChangeKind::Created, path.clone(), is_dir, None);
            if is_dir && self.recursive {
                self.new_dir(&path, total);
            }
            return;
        }
        if flags.contains(ReadFlags::DELETE) {
            self.change(ChangeKind::Deleted, path, is_dir, None);
            return;
        }
        if flags.intersects(ReadFlags::CLOSE_WRITE | ReadFlags::MODIFY | ReadFlags::ATTRIB) {
            // A watched subdirectory reports its own attribute change, and its parent does
            // too: keep the parent's.
            if name.is_none() && wd != self.root_wd {
                return;
            }
            self.change(ChangeKind::Modified, path, is_dir, None);
        }
    }
}

fn join(dir: &str, name: &str) -> String {
    format!("{}/{name}", dir.trim_end_matches('/'))
}

/// Names in a directory, with whether each is a directory (symlinks are not).
fn dir_entries(fd: &OwnedFd) -> Result<Vec<(String, bool)>, Errno> {
    let mut out = Vec::new();
    for e in rustix::fs::Dir::read_from(fd)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name == "." || name == ".." {
            continue;
        }
        let is_dir = match e.file_type() {
            FileType::Directory => true,
            FileType::Unknown => {
                rustix::fs::statat(fd, name.as_str(), rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
                    .map(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory)
                    .unwrap_or(false)
            }
            _ => false,
        };
        out.push((name, is_dir));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn created(p: &str) -> WatchEvent {
        WatchEvent::Change(FileChange {
            kind: ChangeKind::Created,
            path: p.into(),
            is_dir: false,
            from: None,
        })
    }

    #[test]
    fn a_full_queue_keeps_its_events_and_counts_the_excess_in_one_overflow_event() {
        let mut q = VecDeque::new();
        for i in 0..10 {
            push_bounded(&mut q, created(&format!("/f{i}")), 4);
        }
        assert_eq!(q.len(), 5);
        assert_eq!(q[3], created("/f3"));
        assert_eq!(q[4], WatchEvent::Overflow { dropped: Some(6) });
    }
}
