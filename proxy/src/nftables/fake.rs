//! A recording `NftRunner` that can be told to fail (tests, and the `test-util` feature).

use std::sync::{Arc, Mutex};

use super::runner::{Error, NftRunner, Result};

#[derive(Debug, Default)]
struct Inner {
    applied: Vec<String>,
    checked: Vec<String>,
    listed: Vec<String>,
    fail_applies: usize,
    fail_checks_containing: Option<String>,
    list_output: Option<String>,
}

/// Records every transaction; `fail_next_applies(n)` makes the next `n` fail (the kernel
/// keeps its rules: nft transactions are atomic).
#[derive(Clone, Debug, Default)]
pub struct FakeNft {
    inner: Arc<Mutex<Inner>>,
}

impl FakeNft {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Transactions applied successfully, in order.
    pub fn applied(&self) -> Vec<String> {
        self.lock().applied.clone()
    }

    pub fn last_applied(&self) -> Option<String> {
        self.lock().applied.last().cloned()
    }

    pub fn checked(&self) -> Vec<String> {
        self.lock().checked.clone()
    }

    pub fn listed(&self) -> Vec<String> {
        self.lock().listed.clone()
    }

    pub fn fail_next_applies(&self, n: usize) {
        self.lock().fail_applies = n;
    }

    /// `check` fails for texts containing `needle` (a kernel without some feature).
    pub fn fail_checks_containing(&self, needle: &str) {
        self.lock().fail_checks_containing = Some(needle.to_string());
    }

    /// What `list` returns; `None` makes it fail as for a missing table.
    pub fn set_list_output(&self, out: Option<&str>) {
        self.lock().list_output = out.map(str::to_string);
    }
}

impl NftRunner for FakeNft {
    async fn apply(&self, text: &str) -> Result<()> {
        let mut i = self.lock();
        if i.fail_applies > 0 {
            i.fail_applies -= 1;
            return Err(Error::Injected("nft -f failed".into()));
        }
        i.applied.push(text.to_string());
        Ok(())
    }

    async fn check(&self, text: &str) -> Result<()> {
        let mut i = self.lock();
        i.checked.push(text.to_string());
        match &i.fail_checks_containing {
            Some(n) if text.contains(n.as_str()) => Err(Error::Failed {
                cmd: "nft --check -f -".into(),
                status: "exit status: 1".into(),
                stderr: "Error: Could not process rule: No such file or directory".into(),
            }),
            _ => Ok(()),
        }
    }

    async fn list(&self, what: &[&str]) -> Result<String> {
        let mut i = self.lock();
        i.listed.push(what.join(" "));
        i.list_output.clone().ok_or_else(|| Error::Failed {
            cmd: format!("nft list {}", what.join(" ")),
            status: "exit status: 1".into(),
            stderr: "Error: No such file or directory".into(),
        })
    }
}
