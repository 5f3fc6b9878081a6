//! A `Sysctl` over a map, recording writes; keys can be made read-only or absent.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use super::*;

#[derive(Debug, Default)]
struct State {
    values: BTreeMap<String, i64>,
    read_only: BTreeSet<String>,
    writes: Vec<(String, i64)>,
}

#[derive(Clone, Debug, Default)]
pub struct FakeSysctl {
    inner: Arc<Mutex<State>>,
}

impl FakeSysctl {
    pub fn with(self, key: &str, value: i64) -> Self {
        self.inner
            .lock()
            .unwrap()
            .values
            .insert(key.to_string(), value);
        self
    }

    /// The key exists with `value` but refuses writes.
    pub fn read_only(self, key: &str, value: i64) -> Self {
        let s = self.with(key, value);
        s.inner.lock().unwrap().read_only.insert(key.to_string());
        s
    }

    pub fn value(&self, key: &str) -> Option<i64> {
        self.inner.lock().unwrap().values.get(key).copied()
    }

    /// Successful writes, in order.
    pub fn writes(&self) -> Vec<(String, i64)> {
        self.inner.lock().unwrap().writes.clone()
    }
}

impl Sysctl for FakeSysctl {
    async fn get(&self, key: &str) -> Result<i64> {
        self.value(key).ok_or_else(|| Error::Missing {
            key: key.to_string(),
        })
    }

    async fn set(&self, key: &str, value: i64) -> Result<()> {
        let mut g = self.inner.lock().unwrap();
        let key = key.to_string();
        if g.read_only.contains(&key) {
            return Err(Error::ReadOnly { key });
        }
        if !g.values.contains_key(&key) {
            return Err(Error::Missing { key });
        }
        g.values.insert(key.clone(), value);
        g.writes.push((key, value));
        Ok(())
    }
}
