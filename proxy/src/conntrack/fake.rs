//! A recording `Conntrack` with a settable table.

use std::sync::{Arc, Mutex};

use super::*;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    List(IpFamily),
    Delete(IpFamily, Filter),
}

#[derive(Clone, Debug, Default)]
pub struct FakeConntrack {
    inner: Arc<Mutex<(Vec<Call>, Vec<FlowEntry>)>>,
}

impl FakeConntrack {
    /// Replaces the entries `list_udp` returns.
    pub fn set_entries(&self, entries: Vec<FlowEntry>) {
        self.inner.lock().unwrap().1 = entries;
    }

    pub fn entries(&self) -> Vec<FlowEntry> {
        self.inner.lock().unwrap().1.clone()
    }

    pub fn calls(&self) -> Vec<Call> {
        self.inner.lock().unwrap().0.clone()
    }

    pub fn deletions(&self) -> Vec<Filter> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Delete(_, f) => Some(f),
                _ => None,
            })
            .collect()
    }
}

impl Conntrack for FakeConntrack {
    async fn list_udp(&self, family: IpFamily) -> Result<Vec<FlowEntry>> {
        let mut g = self.inner.lock().unwrap();
        g.0.push(Call::List(family));
        Ok(g.1.clone())
    }

    async fn delete_udp(&self, family: IpFamily, filter: &Filter) -> Result<usize> {
        let mut g = self.inner.lock().unwrap();
        g.0.push(Call::Delete(family, filter.clone()));
        let before = g.1.len();
        g.1.retain(|e| {
            !(filter.orig_dst.is_none_or(|d| d == e.orig_dst)
                && filter.orig_dst_port == e.orig_dst_port
                && filter.reply_src == e.reply_src)
        });
        Ok(before - g.1.len())
    }
}
