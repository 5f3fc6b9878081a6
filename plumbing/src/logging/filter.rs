//! Which events are written: klog's `-v` and `-vmodule` over tracing's levels.

use tracing::level_filters::LevelFilter;
use tracing::subscriber::Interest;
use tracing::{Level, Metadata};
use tracing_subscriber::layer::{Context, Layer};

/// One `--vmodule` entry: a file glob and its verbosity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VModule {
    pub pattern: String,
    pub verbosity: i32,
}

/// The klog verbosity of an event at `level`: the lowest `--v` that shows it.
pub fn verbosity_of(level: &Level) -> i32 {
    match *level {
        Level::TRACE => 5,
        Level::DEBUG => 2,
        _ => 0,
    }
}

/// The tracing level `--v=v` shows (and below): 0–1 info, 2–4 debug, 5 and more trace.
pub fn level_for(v: i32) -> LevelFilter {
    match v {
        i32::MIN..=1 => LevelFilter::INFO,
        2..=4 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    }
}

/// klog's filter: an event is written when its verbosity is at most its file's level.
#[derive(Clone, Debug)]
pub struct KlogFilter {
    v: i32,
    vmodule: Vec<VModule>,
}

impl KlogFilter {
    pub fn new(v: i32, vmodule: Vec<VModule>) -> Self {
        KlogFilter { v, vmodule }
    }

    /// The verbosity that applies to events of `file` (a path as `file!()` gives it).
    pub fn level_of(&self, file: Option<&str>) -> i32 {
        let Some(file) = file else { return self.v };
        let path = file.strip_suffix(".rs").unwrap_or(file);
        let base = path.rsplit('/').next().unwrap_or(path);
        let folder = (base == "mod").then(|| path.rsplit('/').nth(1)).flatten();
        for m in &self.vmodule {
            let hit = if m.pattern.contains('/') {
                glob(&m.pattern, path)
            } else {
                glob(&m.pattern, base) || folder.is_some_and(|f| glob(&m.pattern, f))
            };
            if hit {
                return m.verbosity;
            }
        }
        self.v
    }

    pub fn enabled_for(&self, meta: &Metadata<'_>) -> bool {
        verbosity_of(meta.level()) <= self.level_of(meta.file())
    }
}

impl<S: tracing::Subscriber> Layer<S> for KlogFilter {
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        if self.enabled_for(meta) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, meta: &Metadata<'_>, _: Context<'_, S>) -> bool {
        self.enabled_for(meta)
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        let top = self
            .vmodule
            .iter()
            .map(|m| m.verbosity)
            .fold(self.v, i32::max);
        Some(level_for(top))
    }
}

/// Go's `filepath.Match` for the patterns klog takes: `*` any run, `?` one character.
fn glob(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut pi, mut ni) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ni;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob("pod_*", "pod_worker"));
        assert!(glob("a?c", "abc"));
        assert!(!glob("pod", "pod_worker"));
        assert!(glob("*", "x"));
    }

    #[test]
    fn vmodule_matches_files_and_mod_folders_first_match_wins() {
        let f = KlogFilter::new(
            0,
            vec![
                VModule {
                    pattern: "pod_worker".into(),
                    verbosity: 4,
                },
                VModule {
                    pattern: "kubelet/src/status/*".into(),
                    verbosity: 6,
                },
                VModule {
                    pattern: "*".into(),
                    verbosity: 1,
                },
            ],
        );
        assert_eq!(f.level_of(Some("kubelet/src/pod_worker/mod.rs")), 4);
        assert_eq!(f.level_of(Some("kubelet/src/status/writer.rs")), 6);
        assert_eq!(f.level_of(Some("kubelet/src/app/mod.rs")), 1);
        assert_eq!(KlogFilter::new(3, vec![]).level_of(None), 3);
    }
}
