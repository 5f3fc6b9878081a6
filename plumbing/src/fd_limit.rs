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

/// The soft and hard RLIMIT_NOFILE now.
pub fn current() -> Option<(u64, u64)> {
    getrlimit(Resource::RLIMIT_NOFILE).ok()
}

/// What [`raise_to_hard`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Raised {
    /// The soft limit was raised from `from` to `to` (the hard limit).
    Raised { from: u64, to: u64 },
    /// The soft limit already was the hard limit.
    AtHard(u64),
    /// The limits could not be read or set.
    Failed(String),
}

/// Raises the soft RLIMIT_NOFILE to the hard limit, as Go programs do at start (since Go
/// 1.19, which upstream's kube-proxy is built with): the default soft limit of 1024 is a few
/// hundred idle connections away from failing every child process and socket.
pub fn raise_to_hard() -> Raised {
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(l) => l,
        Err(e) => return Raised::Failed(e.to_string()),
    };
    if soft >= hard {
        return Raised::AtHard(soft);
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => Raised::Raised {
            from: soft,
            to: hard,
        },
        Err(e) => Raised::Failed(e.to_string()),
    }
}

/// [`raise_to_hard`], logged.
pub fn raise_to_hard_logged() {
    match raise_to_hard() {
        Raised::Raised { from, to } => {
            tracing::info!(
                from,
                to,
                "raised the soft file descriptor limit to the hard limit"
            )
        }
        Raised::AtHard(n) => tracing::info!(limit = n, "file descriptor limit"),
        Raised::Failed(error) => tracing::warn!(
            %error,
            "could not raise the soft file descriptor limit to the hard limit; going on with the current one"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one() {
        // Lower the soft limit, raise it, then restore what the test process had.
        let (soft, hard) = current().expect("getrlimit");
        if hard < 2 || soft < 2 {
            println!("skipped: the hard file limit ({hard}) is too low to lower and raise");
            return;
        }
        let low = (hard / 2).min(soft).max(1);
        setrlimit(Resource::RLIMIT_NOFILE, low, hard).expect("lowering the soft limit");
        let r = raise_to_hard();
        let now = current().unwrap();
        setrlimit(Resource::RLIMIT_NOFILE, soft, hard).expect("restoring the soft limit");
        if low == hard {
            assert_eq!(r, Raised::AtHard(hard));
        } else {
            assert_eq!(
                r,
                Raised::Raised {
                    from: low,
                    to: hard
                }
            );
        }
        assert_eq!(now, (hard, hard));
    }
}
