//! The process's RLIMIT_NOFILE. The kubelet's `maxOpenFiles` is set at start as upstream's
//! `rlimit.SetNumFiles` does (soft and hard limit both to the configured value). Without the
//! permission to raise the hard limit, the soft limit is raised as far as the hard one allows
//! and a warning says so; the agent goes on. The limit in force is `process_max_fds`.

use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// What was done to the limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FdLimit {
    /// Both limits are now `want`.
    Set(u64),
    /// The hard limit could not be changed: the soft limit is now the hard limit.
    Capped { want: u64, soft: u64, error: String },
}

/// Sets RLIMIT_NOFILE to `want`.
pub fn apply(want: u64) -> FdLimit {
    match setrlimit(Resource::RLIMIT_NOFILE, want, want) {
        Ok(()) => FdLimit::Set(want),
        Err(e) => {
            let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap_or((0, 0));
            let target = want.min(hard);
            let soft = if target > soft && setrlimit(Resource::RLIMIT_NOFILE, target, hard).is_ok()
            {
                target
            } else {
                soft
            };
            FdLimit::Capped {
                want,
                soft,
                error: e.to_string(),
            }
        }
    }
}

/// [`apply`], logged.
pub fn apply_logged(want: u64) {
    match apply(want) {
        FdLimit::Set(n) => tracing::info!(max_open_files = n, "file descriptor limit set"),
        FdLimit::Capped { want, soft, error } => tracing::warn!(
            max_open_files = want,
            limit = soft,
            %error,
            "could not set the file descriptor limit to maxOpenFiles (needs CAP_SYS_RESOURCE); going on with the lower limit"
        ),
    }
}
