use super::*;
use crate::fs_at::race;
use std::os::unix::fs::symlink;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Makes a chain of `depth` directories named `name` under `top` (descriptor-relative, so
/// the path may be longer than PATH_MAX), writes `data` at the bottom, and returns the bytes
/// every object of the chain holds, as `fstat` reports them.
fn chain(top: &Path, name: &str, depth: usize, data: &[u8]) -> u64 {
    use std::io::Write;
    let mut dir = nix::fcntl::open(top, DIR_FLAGS, Mode::empty()).unwrap();
    let mut bytes = 0;
    for _ in 0..depth {
        nix::sys::stat::mkdirat(&dir, name, Mode::from_bits_truncate(0o755)).unwrap();
        dir = nix::fcntl::openat(&dir, name, DIR_FLAGS, Mode::empty()).unwrap();
        bytes += blocks(&nix::sys::stat::fstat(&dir).unwrap());
    }
    let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_CLOEXEC;
    let f = nix::fcntl::openat(&dir, "data", flags, Mode::from_bits_truncate(0o644)).unwrap();
    let mut f = std::fs::File::from(f);
    f.write_all(data).unwrap();
    f.sync_all().unwrap();
    bytes + blocks(&nix::sys::stat::fstat(&f).unwrap())
}

/// Issue 37.3: data below 1,100 levels (a path far beyond PATH_MAX) is counted, exactly:
/// the walk used to stop at 1,024 levels and measured such a volume at a few KB.
#[test]
fn a_tree_deeper_than_a_thousand_levels_is_counted_exactly() {
    let d = tempfile::tempdir().unwrap();
    let vol = d.path().join("vol");
    std::fs::create_dir(&vol).unwrap();
    let chain_bytes = chain(&vol, "level-of-a-deep-chain", 1_100, &vec![1u8; 2 << 20]);
    let top = blocks(&nix::sys::stat::lstat(&vol).unwrap());
    let u = disk_usage(&vol);
    assert_eq!(u.incomplete, None);
    // The top, 1,100 directories, the file.
    assert_eq!(u.inodes, 1 + 1_100 + 1);
    assert_eq!(u.bytes, top + chain_bytes);
    assert!(u.bytes >= 2 << 20, "{}", u.bytes);
}

#[test]
fn disk_usage_counts_like_du_without_following_links() {
    let d = tempfile::tempdir().unwrap();
    let vol = d.path().join("vol");
    std::fs::create_dir_all(vol.join("a/b")).unwrap();
    std::fs::create_dir_all(vol.join("c/e")).unwrap();
    std::fs::write(vol.join("a/b/f"), vec![1u8; 64 << 10]).unwrap();
    std::fs::write(d.path().join("big"), vec![1u8; 4 << 20]).unwrap();
    symlink(d.path(), vol.join("out")).unwrap();
    let u = disk_usage(&vol);
    // vol, a, b, f, c, e, out.
    assert_eq!(u.inodes, 7);
    assert!((64 << 10..1 << 20).contains(&u.bytes), "{}", u.bytes);
    assert_eq!(u.incomplete, None);
    assert_eq!(disk_usage(&d.path().join("missing")), Usage::default());
    // A file alone, and a symlink alone (not followed).
    assert_eq!(disk_usage(&vol.join("a/b/f")).inodes, 1);
    assert!(disk_usage(&vol.join("out")).bytes < 1 << 20);
}

/// A walk past its bounds stops and says so, with what it counted as a floor; the time
/// bound counts every entry, the memory bound every level of a deep chain.
#[test]
fn a_walk_past_its_bounds_says_it_is_incomplete() {
    let d = tempfile::tempdir().unwrap();
    let vol = d.path().join("vol");
    std::fs::create_dir(&vol).unwrap();
    for i in 0..50 {
        std::fs::write(vol.join(format!("f{i}")), b"x").unwrap();
    }
    let few = Limits {
        entries: 20,
        ..LIMITS
    };
    let u = disk_usage_within(&vol, few);
    assert_eq!(u.incomplete, Some(Incomplete::TooManyEntries(20)));
    assert!((1..=21).contains(&u.inodes), "{}", u.inodes);
    assert_eq!(disk_usage_within(&vol, LIMITS).incomplete, None);

    let deep = d.path().join("deep");
    std::fs::create_dir(&deep).unwrap();
    chain(&deep, "d", 200, b"x");
    let small = Limits {
        waiting_bytes: 100 * (FRAME_COST + 1),
        ..LIMITS
    };
    let u = disk_usage_within(&deep, small);
    assert_eq!(
        u.incomplete,
        Some(Incomplete::TooManyWaiting(small.waiting_bytes))
    );
    let u = disk_usage_within(&deep, LIMITS);
    assert_eq!((u.inodes, u.incomplete), (202, None));
}

/// A directory of an emptyDir swapped for a symlink to a big host directory while the
/// usage walk runs never gets the host directory measured (the stats walker's path).
#[test]
fn disk_usage_never_measures_through_a_directory_swapped_for_a_symlink() {
    let d = tempfile::tempdir().unwrap();
    let vol = d.path().join("vol");
    std::fs::create_dir_all(vol.join("d/e")).unwrap();
    std::fs::create_dir_all(d.path().join("host/e")).unwrap();
    // 8 MiB of real blocks outside the volume, in a file and below a directory.
    std::fs::write(d.path().join("host/big"), vec![7u8; 8 << 20]).unwrap();
    std::fs::write(d.path().join("host/e/big"), vec![7u8; 8 << 20]).unwrap();
    symlink(d.path().join("host"), vol.join("x")).unwrap();
    let (honest, _) = crate::stats::disk::usage(&vol);
    assert!(honest < 1 << 20, "{honest}");
    let swapper = race::Swapper::start(&vol, "d", "x");
    let mut walks = 0;
    let inflated = race::race(20_000, Duration::from_secs(6), || {
        walks += 1;
        let (bytes, _) = crate::stats::disk::usage(&vol);
        (bytes >= 4 << 20).then_some(bytes)
    });
    let swaps = swapper.stop();
    assert_eq!(inflated, None, "the host directory was measured");
    assert!(swaps > 0 && walks > 0, "{swaps} swaps, {walks} walks");
}

/// A thread that keeps moving `from` to `to` and back (plain renames across directories):
/// a container moving the directory the walk is in.
struct Mover {
    stop: Arc<AtomicBool>,
    moves: Arc<AtomicU64>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Mover {
    fn start(from: &Path, to: &Path) -> Mover {
        let stop = Arc::new(AtomicBool::new(false));
        let moves = Arc::new(AtomicU64::new(0));
        let (from, to) = (from.to_path_buf(), to.to_path_buf());
        let (flag, count) = (stop.clone(), moves.clone());
        let handle = std::thread::spawn(move || {
            let began = std::time::Instant::now();
            while !flag.load(Ordering::Relaxed) && began.elapsed() < Duration::from_secs(60) {
                std::fs::rename(&from, &to).unwrap();
                std::fs::rename(&to, &from).unwrap();
                count.fetch_add(2, Ordering::Relaxed);
            }
        });
        Mover {
            stop,
            moves,
            handle: Some(handle),
        }
    }

    fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            h.join().unwrap();
        }
        self.moves.load(Ordering::Relaxed)
    }
}

/// The directory the walk is in, moved out from under it (here to a host directory whose
/// subdirectories bear the names still to visit, each holding a big file), never leads the
/// walk out: its `..` is not the parent the walk came down from, so the walk finds that
/// parent again from the top. Every walk counts the volume and nothing of the host.
#[test]
fn a_directory_moved_during_the_walk_never_leads_it_out() {
    let d = tempfile::tempdir().unwrap();
    let vol = d.path().join("vol");
    let host = d.path().join("host");
    std::fs::create_dir_all(vol.join("p")).unwrap();
    std::fs::create_dir_all(&host).unwrap();
    for i in 0..40 {
        std::fs::create_dir(vol.join(format!("p/s{i:02}"))).unwrap();
    }
    // The walk visits `p`'s subdirectories from the last listed: that one is moved while
    // the walk is in it (a chain of 60 directories to spend time in), the others are the
    // names the walk still has to visit when it climbs back.
    let listed: Vec<_> = std::fs::read_dir(vol.join("p"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let (moved, rest) = listed.split_last().unwrap();
    chain(&vol.join("p").join(moved), "c", 60, b"x");
    for name in rest {
        std::fs::create_dir(host.join(name)).unwrap();
        std::fs::write(host.join(name).join("big"), vec![7u8; 256 << 10]).unwrap();
    }
    let honest = disk_usage(&vol);
    assert!(honest.bytes < 1 << 20, "{honest:?}");
    let mover = Mover::start(&vol.join("p").join(moved), &host.join(moved));
    let (mut walks, mut finished) = (0, 0);
    let leaked = race::race(5_000, Duration::from_secs(6), || {
        walks += 1;
        let u = disk_usage(&vol);
        finished += usize::from(u.incomplete.is_none());
        (u.bytes >= 1 << 20).then_some(u)
    });
    let moves = mover.stop();
    assert_eq!(leaked, None, "the host's directories were measured");
    assert!(
        moves > 0 && walks > 0 && finished > 0,
        "{moves} moves, {walks} walks, {finished} finished"
    );
}
