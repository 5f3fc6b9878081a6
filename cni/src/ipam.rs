//! Host-local style address store: one file per allocated address under the network's data
//! directory (`<dataDir>/<network>/<ip>`, holding `<containerID>\r\n<ifname>`), the last
//! address handed out per subnet (`last_reserved_ip.<index>`, so a freed address is not reused
//! at once), and a `lock` file taken with `flock` around every change. Files make the store
//! survive restarts; `O_EXCL` creation and the lock make sure no address is handed out twice.

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};

use crate::config::Attachment;
use crate::error::{Error, Result};
use plumbing::cidr::Cidr;

/// How long an ADD or DEL waits for another invocation holding the lock.
const LOCK_WAIT: Duration = Duration::from_secs(30);
/// Scan bound for huge (IPv6) subnets: past this many taken addresses in a row, give up.
const MAX_SCAN: u128 = 1 << 20;
const LINE_BREAK: &str = "\r\n";

/// The allocation directory of one network.
#[derive(Clone, Debug)]
pub struct Store {
    dir: PathBuf,
}

/// The held lock; dropping it unlocks.
pub struct Locked<'a> {
    store: &'a Store,
    _lock: Flock<File>,
}

impl std::fmt::Debug for Locked<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locked")
            .field("dir", &self.store.dir)
            .finish()
    }
}

fn io(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::Io(format!("{what} {}: {e}", path.display()))
}

impl Store {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Store { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Creates the directory and takes the lock, waiting up to 30 s for another invocation.
    pub fn lock(&self) -> Result<Locked<'_>> {
        fs::create_dir_all(&self.dir).map_err(|e| io("create", &self.dir, e))?;
        let path = self.dir.join("lock");
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| io("open", &path, e))?;
        let deadline = Instant::now() + LOCK_WAIT;
        loop {
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => {
                    return Ok(Locked {
                        store: self,
                        _lock: lock,
                    });
                }
                Err((back, errno)) if errno == nix::errno::Errno::EWOULDBLOCK => {
                    if Instant::now() >= deadline {
                        return Err(Error::TryAgainLater(format!(
                            "{} is locked by another invocation",
                            path.display()
                        )));
                    }
                    file = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err((_, errno)) => return Err(io("lock", &path, errno.into())),
            }
        }
    }
}

fn owner_line(container_id: &str, ifname: &str) -> String {
    format!("{container_id}{LINE_BREAK}{ifname}")
}

impl Locked<'_> {
    /// Every allocation: (address, owner line).
    fn entries(&self) -> Result<Vec<(IpAddr, PathBuf, String)>> {
        let dir = &self.store.dir;
        let mut out = Vec::new();
        for entry in fs::read_dir(dir).map_err(|e| io("read", dir, e))? {
            let entry = entry.map_err(|e| io("read", dir, e))?;
            let Some(ip) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<IpAddr>().ok())
            else {
                continue;
            };
            let path = entry.path();
            match fs::read_to_string(&path) {
                Ok(owner) => out.push((ip, path, owner.trim().to_string())),
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(io("read", &path, e)),
            }
        }
        Ok(out)
    }

    /// The addresses held by this attachment, in subnet order.
    pub fn get(&self, container_id: &str, ifname: &str, subnets: &[Cidr]) -> Result<Vec<Cidr>> {
        let owner = owner_line(container_id, ifname);
        let held: Vec<IpAddr> = self
            .entries()?
            .into_iter()
            .filter(|(_, _, o)| *o == owner)
            .map(|(ip, _, _)| ip)
            .collect();
        Ok(subnets
            .iter()
            .filter_map(|s| {
                held.iter().find(|ip| s.contains(**ip)).map(|ip| Cidr {
                    addr: *ip,
                    prefix: s.prefix,
                })
            })
            .collect())
    }

    /// One address per subnet for this attachment. An attachment that already holds addresses
    /// gets them back (a repeated ADD), so it never holds two.
    pub fn allocate(
        &self,
        container_id: &str,
        ifname: &str,
        subnets: &[Cidr],
    ) -> Result<Vec<Cidr>> {
        let existing = self.get(container_id, ifname, subnets)?;
        let owner = owner_line(container_id, ifname);
        let mut out = Vec::new();
        for (index, subnet) in subnets.iter().enumerate() {
            if let Some(have) = existing.iter().find(|a| subnet.contains(a.addr)) {
                out.push(*have);
                continue;
            }
            match self.allocate_in(index, subnet, &owner) {
                Ok(ip) => out.push(Cidr {
                    addr: ip,
                    prefix: subnet.prefix,
                }),
                Err(e) => {
                    // Leave nothing half-allocated behind.
                    for got in &out {
                        let _ = fs::remove_file(self.store.dir.join(got.addr.to_string()));
                    }
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    fn allocate_in(&self, index: usize, subnet: &Cidr, owner: &str) -> Result<IpAddr> {
        // Offsets 2..=last: 0 is the network, 1 the gateway; IPv4 also keeps its broadcast.
        let first = 2u128;
        let last = if subnet.is_ipv4() {
            subnet.host_span() - 1
        } else {
            subnet.host_span()
        };
        let count = last - first + 1;
        let last_path = self.store.dir.join(format!("last_reserved_ip.{index}"));
        let start = fs::read_to_string(&last_path)
            .ok()
            .and_then(|s| s.trim().parse::<IpAddr>().ok())
            .and_then(|ip| subnet.offset(ip))
            .filter(|o| (first..=last).contains(o))
            .map_or(first, |o| if o == last { first } else { o + 1 });
        for step in 0..count.min(MAX_SCAN) {
            let offset = first + (start - first + step) % count;
            let Some(ip) = subnet.nth(offset) else {
                continue;
            };
            let path = self.store.dir.join(ip.to_string());
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(mut f) => {
                    f.write_all(owner.as_bytes())
                        .map_err(|e| io("write", &path, e))?;
                    let tmp = last_path.with_extension(format!("{index}.tmp"));
                    fs::write(&tmp, ip.to_string()).map_err(|e| io("write", &tmp, e))?;
                    fs::rename(&tmp, &last_path).map_err(|e| io("rename", &last_path, e))?;
                    return Ok(ip);
                }
                Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io("create", &path, e)),
            }
        }
        Err(Error::Exhausted(subnet.to_string()))
    }

    /// Frees this attachment's addresses; freeing nothing is fine (DEL is idempotent).
    pub fn release(&self, container_id: &str, ifname: &str) -> Result<Vec<IpAddr>> {
        let owner = owner_line(container_id, ifname);
        let mut freed = Vec::new();
        for (ip, path, o) in self.entries()? {
            if o == owner {
                match fs::remove_file(&path) {
                    Ok(()) => freed.push(ip),
                    Err(e) if e.kind() == ErrorKind::NotFound => {}
                    Err(e) => return Err(io("remove", &path, e)),
                }
            }
        }
        Ok(freed)
    }

    /// CNI 1.1 GC: frees every allocation whose attachment is not in `valid`.
    pub fn retain(&self, valid: &[Attachment]) -> Result<Vec<IpAddr>> {
        let keep: Vec<String> = valid
            .iter()
            .map(|a| owner_line(&a.container_id, &a.ifname))
            .collect();
        let mut freed = Vec::new();
        for (ip, path, owner) in self.entries()? {
            if !keep.contains(&owner) {
                fs::remove_file(&path).map_err(|e| io("remove", &path, e))?;
                freed.push(ip);
            }
        }
        Ok(freed)
    }

    /// Whether each subnet still has a free address (STATUS).
    pub fn has_free(&self, subnets: &[Cidr]) -> Result<bool> {
        let taken = self.entries()?;
        Ok(subnets.iter().all(|s| {
            let usable = if s.is_ipv4() {
                s.host_span() - 2
            } else {
                s.host_span() - 1
            };
            let used = taken.iter().filter(|(ip, _, _)| s.contains(*ip)).count() as u128;
            used < usable
        }))
    }
}

#[cfg(test)]
mod tests;
