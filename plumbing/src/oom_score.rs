//! The process's own OOM score adjustment (`/proc/self/oom_score_adj`), as upstream's
//! `ApplyOOMScoreAdj(0, value)`: both daemons lower theirs at start (default -999) so the
//! kernel kills workloads before the node agent. Lowering it needs CAP_SYS_RESOURCE; without
//! it the write fails and the caller logs and goes on, as upstream.

use std::io;
use std::path::Path;

/// The file the kernel reads the adjustment of this process from.
pub const SELF_OOM_SCORE_ADJ: &str = "/proc/self/oom_score_adj";

/// The kernel's range.
pub const RANGE: std::ops::RangeInclusive<i32> = -1000..=1000;

/// Writes `value` into `file` (normally [`SELF_OOM_SCORE_ADJ`]); a value outside [`RANGE`]
/// is refused before any write. Upstream tries twice; so does this.
pub fn apply(file: &Path, value: i32) -> io::Result<()> {
    if !RANGE.contains(&value) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "invalid value({value}) specified for oom_score_adj. Values must be within the range [-1000, 1000]"
            ),
        ));
    }
    let mut last = None;
    for _ in 0..2 {
        match std::fs::write(file, value.to_string()) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(e),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("oom_score_adj not written")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_the_value_and_refuses_one_out_of_range() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("oom_score_adj");
        std::fs::write(&f, "0").unwrap();
        apply(&f, -999).unwrap();
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "-999");
        let e = apply(&f, 1001).unwrap_err();
        assert!(e.to_string().contains("range [-1000, 1000]"), "{e}");
        assert_eq!(
            std::fs::read_to_string(&f).unwrap(),
            "-999",
            "nothing written"
        );
        assert!(apply(&dir.path().join("missing/oom_score_adj"), 0).is_err());
    }

    /// The real file: raising our own score needs no privilege; lowering it below where it
    /// started needs CAP_SYS_RESOURCE, which this host may lack (then the error says so).
    #[test]
    fn the_real_file_takes_a_raise() {
        let path = Path::new(SELF_OOM_SCORE_ADJ);
        let Ok(now) = std::fs::read_to_string(path) else {
            eprintln!("SKIPPED: {SELF_OOM_SCORE_ADJ} is not readable here");
            return;
        };
        let now: i32 = now.trim().parse().unwrap();
        // The test process keeps the raised value; raising is always allowed.
        let raised = (now + 1).min(1000);
        apply(path, raised).unwrap();
        let read: i32 = std::fs::read_to_string(path)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(read, raised);
    }
}
