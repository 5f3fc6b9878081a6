//! A recording `IptablesRunner` that can be told to fail (tests, and the `test-util`
//! feature).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use std::time::Duration;

use super::*;
use crate::cidr::IpFamily;

/// One call seen by the fake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    Restore { data: String, noflush: bool },
    Save(TableName),
    EnsureChain(TableName, String),
    ChainExists(TableName, String),
    EnsureRule(Position, TableName, String, Vec<String>),
    Version,
}

#[derive(Debug, Default)]
struct Inner {
    calls: Vec<Call>,
    fail_restores: usize,
    /// Chains the fake believes exist, per table (fed by restores and ensure_chain).
    chains: BTreeSet<(TableName, String)>,
    rules: BTreeSet<(TableName, String, Vec<String>)>,
    /// Rules restored with `-I` (the jump rules), shown by `save` as `-A` lines.
    inserted: Vec<(TableName, String)>,
    save_output: Option<String>,
}

#[derive(Clone, Debug)]
pub struct FakeRunner {
    family: IpFamily,
    inner: Arc<Mutex<Inner>>,
    slow: Option<(OverlapProbe, Duration)>,
}

/// Shared by fakes to see whether their calls ever run at the same time.
#[derive(Clone, Debug, Default)]
pub struct OverlapProbe {
    running: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    calls: Arc<AtomicUsize>,
}

impl OverlapProbe {
    /// The most calls that were running at once.
    pub fn most_at_once(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    async fn during(&self, delay: Duration) {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        self.calls.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(delay).await;
        self.running.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Default for FakeRunner {
    fn default() -> Self {
        Self::new(IpFamily::V4)
    }
}

impl FakeRunner {
    pub fn new(family: IpFamily) -> Self {
        FakeRunner {
            family,
            inner: Arc::default(),
            slow: None,
        }
    }

    /// Every restore and save takes `delay`, recorded in `probe` as it runs.
    pub fn slow(mut self, probe: OverlapProbe, delay: Duration) -> Self {
        self.slow = Some((probe, delay));
        self
    }

    async fn take_time(&self) {
        if let Some((probe, delay)) = &self.slow {
            probe.during(*delay).await;
        }
    }

    /// Makes the next `n` restores fail.
    pub fn fail_next_restores(&self, n: usize) {
        self.inner.lock().unwrap().fail_restores = n;
    }

    /// What `save` returns (default: the declared chains of that table).
    pub fn set_save_output(&self, s: Option<String>) {
        self.inner.lock().unwrap().save_output = s;
    }

    /// Forgets a chain, as if an admin had flushed it away.
    pub fn remove_chain(&self, table: TableName, chain: &str) {
        self.inner
            .lock()
            .unwrap()
            .chains
            .remove(&(table, chain.to_string()));
    }

    pub fn calls(&self) -> Vec<Call> {
        self.inner.lock().unwrap().calls.clone()
    }

    pub fn clear_calls(&self) {
        self.inner.lock().unwrap().calls.clear();
    }

    /// The data of every successful or failed restore of rules, in order; not the
    /// restores of jump rules and canary chains (see `jump_restores`).
    pub fn restores(&self) -> Vec<String> {
        self.all_restores()
            .into_iter()
            .filter(|r| !is_jump_restore(r))
            .collect()
    }

    /// The restores that only declare chains and insert (`-I`) jump rules.
    pub fn jump_restores(&self) -> Vec<String> {
        self.all_restores()
            .into_iter()
            .filter(|r| is_jump_restore(r))
            .collect()
    }

    /// Every restore, in order.
    pub fn all_restores(&self) -> Vec<String> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Restore { data, .. } => Some(data),
                _ => None,
            })
            .collect()
    }
}

fn is_jump_restore(text: &str) -> bool {
    !text
        .lines()
        .any(|l| l.starts_with("-A ") || l.starts_with("-D ") || l.starts_with("-X "))
}

impl IptablesRunner for FakeRunner {
    fn family(&self) -> IpFamily {
        self.family
    }

    async fn version(&self) -> Result<IptablesVersion> {
        self.inner.lock().unwrap().calls.push(Call::Version);
        Ok(IptablesVersion {
            major: 1,
            minor: 8,
            patch: 9,
            variant: Some(Variant::Nft),
        })
    }

    async fn restore(&self, data: &str, noflush: bool) -> Result<()> {
        self.take_time().await;
        let mut inner = self.inner.lock().unwrap();
        inner.calls.push(Call::Restore {
            data: data.to_string(),
            noflush,
        });
        if inner.fail_restores > 0 {
            inner.fail_restores -= 1;
            return Err(Error::Injected("iptables-restore: line 3 failed".into()));
        }
        let mut table = TableName::Filter;
        for line in data.lines() {
            if let Some(t) = line.strip_prefix('*') {
                table = match t {
                    "nat" => TableName::Nat,
                    "mangle" => TableName::Mangle,
                    _ => TableName::Filter,
                };
            } else if let Some(rest) = line.strip_prefix(':') {
                let name = rest.split_whitespace().next().unwrap_or_default();
                inner.chains.insert((table, name.to_string()));
            } else if let Some(name) = line.strip_prefix("-X ") {
                inner.chains.remove(&(table, name.trim().to_string()));
            } else if let Some(rule) = line.strip_prefix("-I ") {
                inner.inserted.push((table, format!("-A {rule}")));
            }
        }
        Ok(())
    }

    async fn save(&self, table: TableName) -> Result<String> {
        self.take_time().await;
        let mut inner = self.inner.lock().unwrap();
        inner.calls.push(Call::Save(table));
        if let Some(s) = &inner.save_output {
            return Ok(s.clone());
        }
        let mut out = format!("*{}\n", table.as_str());
        for (t, c) in &inner.chains {
            if *t == table {
                out.push_str(&format!(":{c} - [0:0]\n"));
            }
        }
        for (t, r) in &inner.inserted {
            if *t == table {
                out.push_str(r);
                out.push('\n');
            }
        }
        out.push_str("COMMIT\n");
        Ok(out)
    }

    async fn ensure_chain(&self, table: TableName, chain: &str) -> Result<bool> {
        let mut inner = self.inner.lock().unwrap();
        inner
            .calls
            .push(Call::EnsureChain(table, chain.to_string()));
        Ok(!inner.chains.insert((table, chain.to_string())))
    }

    async fn chain_exists(&self, table: TableName, chain: &str) -> Result<bool> {
        let mut inner = self.inner.lock().unwrap();
        inner
            .calls
            .push(Call::ChainExists(table, chain.to_string()));
        Ok(inner.chains.contains(&(table, chain.to_string())))
    }

    async fn ensure_rule(
        &self,
        position: Position,
        table: TableName,
        chain: &str,
        args: &[String],
    ) -> Result<bool> {
        let mut inner = self.inner.lock().unwrap();
        inner.calls.push(Call::EnsureRule(
            position,
            table,
            chain.to_string(),
            args.to_vec(),
        ));
        Ok(!inner
            .rules
            .insert((table, chain.to_string(), args.to_vec())))
    }
}
