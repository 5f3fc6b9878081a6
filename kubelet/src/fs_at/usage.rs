//! A descriptor-relative `du` of a directory a container writes to (emptyDir, logs): the
//! whole tree, however deep, with two descriptors open at a time, never following a symlink
//! and never leaving the tree.
//!
//! The walk holds the directory it is in, not one descriptor per level: the names of the
//! subdirectories still to visit wait in memory, and it climbs back by opening the child's
//! `..`, accepted only when its (device, inode) is the parent it came down from. A directory
//! moved elsewhere meanwhile leads to some other `..`: the walk then finds its parent again
//! from the top by the names it came down, each checked the same way, or starts over when
//! the path itself moved. A container can make the walk long (millions of entries, a chain
//! of a million directories) or keep it moving: it is bounded ([`LIMITS`]), and a walk that
//! could not finish says so ([`Usage::incomplete`]) so that its figure counts as a floor:
//! the eviction manager treats such a volume as over its limits.
//! Blocking: callers run on the blocking pool.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};

/// Bytes allocated (512-byte blocks, as du) and inodes of a tree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    pub bytes: u64,
    pub inodes: u64,
    /// Why the walk stopped before the end; `bytes` and `inodes` are then what it counted
    /// until then (a floor).
    pub incomplete: Option<Incomplete>,
}

/// Why a walk could not count the whole tree.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Incomplete {
    #[error("it holds more than {0} entries")]
    TooManyEntries(u64),
    #[error("more than {0} bytes of directory names waited to be walked")]
    TooManyWaiting(usize),
    #[error("its directories kept moving during the walk ({0} restarts)")]
    KeptMoving(u32),
}

/// The bounds of one walk.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Entries looked at, over every restart (each costs a `fstatat`): bounds the time.
    pub entries: u64,
    /// Memory held for the directories still to visit and the levels walked down (a name's
    /// length plus [`FRAME_COST`] each): bounds the memory, a deep chain included.
    pub waiting_bytes: usize,
    /// Walks started over after the tree moved under the walk.
    pub restarts: u32,
}

/// The kubelet's bounds: about ten seconds of `fstatat` at most and 64 MiB.
pub const LIMITS: Limits = Limits {
    entries: 5_000_000,
    waiting_bytes: 64 << 20,
    restarts: 3,
};

/// What one waiting name or one level costs beyond its bytes (its `OsString`, allocator).
pub const FRAME_COST: usize = 48;

const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// [`disk_usage_within`] the kubelet's [`LIMITS`].
pub fn disk_usage(path: &Path) -> Usage {
    disk_usage_within(path, LIMITS)
}

/// Bytes and inodes of `path` and everything beneath it (the top counts), never following a
/// symlink: each directory is opened with `O_NOFOLLOW` from its parent's descriptor, so one
/// a container swaps for a symlink mid-walk is not entered. A missing `path` is empty.
pub fn disk_usage_within(path: &Path, limits: Limits) -> Usage {
    let Ok(st) = nix::sys::stat::lstat(path) else {
        return Usage::default();
    };
    let top = (blocks(&st), 1);
    let whole = |(bytes, inodes): (u64, u64), incomplete| Usage {
        bytes,
        inodes,
        incomplete,
    };
    if !is_dir(&st) {
        return whole(top, None);
    }
    let Ok(root) = nix::fcntl::open(path, DIR_FLAGS, Mode::empty()) else {
        return whole(top, None);
    };
    let mut seen = 0u64;
    let mut restarts = 0;
    loop {
        let mut walk = Walk {
            root: &root,
            limits,
            seen: &mut seen,
            waiting: 0,
            total: top,
        };
        match walk.run() {
            Ok(()) => return whole(walk.total, None),
            Err(Stop::Moved) if restarts < limits.restarts => restarts += 1,
            Err(Stop::Moved) => return whole(walk.total, Some(Incomplete::KeptMoving(restarts))),
            Err(Stop::Over(why)) => return whole(walk.total, Some(why)),
        }
    }
}

/// Why one pass ended early.
enum Stop {
    /// The way back up is not the way the walk came down.
    Moved,
    Over(Incomplete),
}

/// One level walked down: the directory's identity, its name in its parent, the names of
/// its subdirectories still to visit.
struct Level {
    id: (u64, u64),
    name: OsString,
    todo: Vec<OsString>,
}

struct Walk<'a> {
    root: &'a OwnedFd,
    limits: Limits,
    /// Entries looked at by every pass so far.
    seen: &'a mut u64,
    /// What the levels and their waiting names hold, as [`Limits::waiting_bytes`] counts.
    waiting: usize,
    total: (u64, u64),
}

fn cost(name: &OsStr) -> usize {
    name.len() + FRAME_COST
}

impl Walk<'_> {
    fn run(&mut self) -> Result<(), Stop> {
        let Ok(mut cur) = self.root.try_clone() else {
            return Ok(());
        };
        let Some(id) = identity(&cur) else {
            return Ok(());
        };
        let todo = self.list(&cur)?;
        let mut levels = vec![Level {
            id,
            name: OsString::new(),
            todo,
        }];
        loop {
            let top = levels
                .last_mut()
                .expect("the top level stays until the end");
            if let Some(name) = top.todo.pop() {
                self.waiting -= cost(&name);
                // Gone, or swapped for a symlink or a file since it was listed: not entered.
                let Ok(child) =
                    nix::fcntl::openat(&cur, name.as_os_str(), DIR_FLAGS, Mode::empty())
                else {
                    continue;
                };
                let Some(id) = identity(&child) else { continue };
                let todo = self.list(&child)?;
                self.charge(&name)?;
                levels.push(Level { id, name, todo });
                cur = child;
                continue;
            }
            let done = levels.pop().expect("a level");
            self.waiting -= if levels.is_empty() {
                0
            } else {
                cost(&done.name)
            };
            let Some(parent) = levels.last() else {
                return Ok(());
            };
            cur = self.climb(&cur, parent.id, &levels)?;
        }
    }

    /// The parent of `cur`, through its `..` when that is still the directory the walk came
    /// down from, else found again from the top by `levels`' names.
    fn climb(&self, cur: &OwnedFd, parent: (u64, u64), levels: &[Level]) -> Result<OwnedFd, Stop> {
        if let Ok(up) = nix::fcntl::openat(cur, "..", DIR_FLAGS, Mode::empty())
            && identity(&up) == Some(parent)
        {
            return Ok(up);
        }
        let mut fd = self.root.try_clone().map_err(|_| Stop::Moved)?;
        if identity(&fd) != Some(levels[0].id) {
            return Err(Stop::Moved);
        }
        for level in &levels[1..] {
            fd = nix::fcntl::openat(&fd, level.name.as_os_str(), DIR_FLAGS, Mode::empty())
                .map_err(|_| Stop::Moved)?;
            if identity(&fd) != Some(level.id) {
                return Err(Stop::Moved);
            }
        }
        Ok(fd)
    }

    /// Counts the entries of `dir` (not followed) and returns its subdirectories' names.
    fn list(&mut self, dir: &OwnedFd) -> Result<Vec<OsString>, Stop> {
        let mut subdirs = Vec::new();
        let Ok(mut entries) = nix::dir::Dir::openat(dir, ".", DIR_FLAGS, Mode::empty()) else {
            return Ok(subdirs);
        };
        for e in entries.iter().flatten() {
            let name = OsStr::from_bytes(e.file_name().to_bytes());
            if name == "." || name == ".." {
                continue;
            }
            *self.seen += 1;
            if *self.seen > self.limits.entries {
                return Err(Stop::Over(Incomplete::TooManyEntries(self.limits.entries)));
            }
            let Ok(st) = nix::sys::stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) else {
                continue;
            };
            self.total.0 += blocks(&st);
            self.total.1 += 1;
            if is_dir(&st) {
                self.charge(name)?;
                subdirs.push(name.to_os_string());
            }
        }
        Ok(subdirs)
    }

    fn charge(&mut self, name: &OsStr) -> Result<(), Stop> {
        self.waiting += cost(name);
        if self.waiting > self.limits.waiting_bytes {
            return Err(Stop::Over(Incomplete::TooManyWaiting(
                self.limits.waiting_bytes,
            )));
        }
        Ok(())
    }
}

/// (device, inode) of the directory `fd` is open on.
fn identity(fd: impl AsFd) -> Option<(u64, u64)> {
    let st = nix::sys::stat::fstat(fd).ok()?;
    Some((st.st_dev, st.st_ino))
}

fn is_dir(st: &FileStat) -> bool {
    SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR
}

fn blocks(st: &FileStat) -> u64 {
    u64::try_from(st.st_blocks).unwrap_or(0) * 512
}

#[cfg(test)]
mod tests;
