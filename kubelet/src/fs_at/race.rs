//! Test help: a thread that keeps exchanging two entries of a directory (`renameat2` with
//! `RENAME_EXCHANGE`, atomic), the way a container would swap a directory for a symlink
//! between a check and an open.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The swapping thread; stops when dropped.
pub struct Swapper {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<u64>>,
}

impl Swapper {
    /// Exchanges `a` and `b` in `dir` over and over (at most `LIMIT`, a bound for a
    /// forgotten swapper).
    pub fn start(dir: &Path, a: &str, b: &str) -> Swapper {
        const LIMIT: Duration = Duration::from_secs(60);
        let stop = Arc::new(AtomicBool::new(false));
        let (dir, a, b) = (dir.to_path_buf(), a.to_string(), b.to_string());
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let d = super::open_dir(&dir).expect("open the directory");
            let began = Instant::now();
            let mut swaps = 0u64;
            while !flag.load(Ordering::Relaxed) && began.elapsed() < LIMIT {
                nix::fcntl::renameat2(
                    &d,
                    a.as_str(),
                    &d,
                    b.as_str(),
                    nix::fcntl::RenameFlags::RENAME_EXCHANGE,
                )
                .expect("exchange");
                swaps += 1;
            }
            swaps
        });
        Swapper {
            stop,
            handle: Some(handle),
        }
    }

    /// Stops the thread; how many exchanges it made.
    pub fn stop(mut self) -> u64 {
        self.halt()
    }

    fn halt(&mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.handle
            .take()
            .map(|h| h.join().expect("swapper"))
            .unwrap_or(0)
    }
}

impl Drop for Swapper {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Calls `attempt` until it returns `Some` (what a race produced) or `tries`/`limit` run
/// out; `None` when the race never produced anything.
pub fn race<T>(tries: usize, limit: Duration, mut attempt: impl FnMut() -> Option<T>) -> Option<T> {
    let began = Instant::now();
    for _ in 0..tries {
        if began.elapsed() > limit {
            break;
        }
        if let Some(found) = attempt() {
            return Some(found);
        }
    }
    None
}
