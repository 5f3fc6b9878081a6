//! Who may hold the open-connection slots of one server (issue 24: with one cap shared by
//! everyone, a single host without credentials could hold every slot of :10250 and lock out
//! the apiserver's exec/logs and metrics-server).
//!
//! A connection is *pending* from its accept until a request on it is authorized, then
//! *authenticated*. The rules, checked at accept under one lock:
//! - at most `max_connections` open connections;
//! - at most `max_per_source` pending connections from one source (an IPv4 address, or the
//!   /64 of an IPv6 one: a host commonly holds a whole /64); more from it are refused;
//! - `authenticated_reserve` of the slots are for authenticated connections: pending ones hold
//!   at most `max_connections − authenticated_reserve`. When a new connection finds no slot,
//!   the longest-pending connection is evicted (closed) to make room when there is a reserve,
//!   so a flood from many sources delays new clients by its churn, and never starves the
//!   authenticated connections; without a reserve (servers with no authentication) it is
//!   refused.
//!
//! Authenticated connections count against `max_connections` and, per identity (the user name
//! a request was authorized as), against `max_per_identity` (issue 37.4: one client holding
//! any authorized permission could otherwise fill every slot, the apiserver's included). A
//! connection whose identity already holds its cap stays pending: it counts against its
//! source and may be evicted like any other. A source's pending count drops when one of its
//! connections authenticates.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

/// The connection limits of one server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Open connections at most.
    pub max_connections: usize,
    /// Pending connections from one source at most (`usize::MAX`: no cap).
    pub max_per_source: usize,
    /// Slots only authenticated connections may hold (0: none, and no eviction).
    pub authenticated_reserve: usize,
    /// Authenticated connections of one identity at most (`usize::MAX`: no cap).
    pub max_per_identity: usize,
}

/// What connections are counted under: an IPv4 address (IPv4-mapped IPv6 included), or the
/// upper 64 bits of an IPv6 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    V4(u32),
    V6Prefix64(u64),
}

impl Source {
    pub fn of(ip: IpAddr) -> Source {
        match ip.to_canonical() {
            IpAddr::V4(v4) => Source::V4(u32::from(v4)),
            IpAddr::V6(v6) => Source::V6Prefix64((u128::from(v6) >> 64) as u64),
        }
    }
}

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Every slot is held and none may be evicted.
    Full,
    /// Its source holds `max_per_source` pending connections.
    PerSource,
}

impl Refusal {
    /// The `reason` label of `kubelet_server_rejected_connections_total`.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Full => "max_connections",
            Refusal::PerSource => "per_source",
        }
    }
}

struct Pending {
    source: Source,
    evict: CancellationToken,
}

#[derive(Default)]
struct State {
    open: usize,
    /// Pending connections by admission order (oldest first).
    pending: BTreeMap<u64, Pending>,
    per_source: HashMap<Source, usize>,
    /// Authenticated connections: their identity.
    authenticated: HashMap<u64, std::sync::Arc<str>>,
    per_identity: HashMap<std::sync::Arc<str>, usize>,
    next_id: u64,
}

impl State {
    fn forget_pending(&mut self, id: u64) -> Option<Pending> {
        let p = self.pending.remove(&id)?;
        if let Some(n) = self.per_source.get_mut(&p.source) {
            *n -= 1;
            if *n == 0 {
                self.per_source.remove(&p.source);
            }
        }
        Some(p)
    }

    fn forget_authenticated(&mut self, id: u64) -> bool {
        let Some(who) = self.authenticated.remove(&id) else {
            return false;
        };
        if let Some(n) = self.per_identity.get_mut(&who) {
            *n -= 1;
            if *n == 0 {
                self.per_identity.remove(&who);
            }
        }
        true
    }
}

/// The admission state of one server.
pub struct Limiter {
    limits: ConnLimits,
    state: Mutex<State>,
}

/// An admitted connection: its slot is held until this is dropped (or it is evicted).
pub struct Slot {
    limiter: Arc<Limiter>,
    id: u64,
    evicted: CancellationToken,
}

/// A connection let in.
pub struct Admitted {
    pub slot: Slot,
    /// A pending connection was evicted to make room.
    pub evicted_another: bool,
}

impl Limiter {
    pub fn new(limits: ConnLimits) -> Arc<Limiter> {
        Arc::new(Limiter {
            limits,
            state: Mutex::new(State::default()),
        })
    }

    pub fn limits(&self) -> ConnLimits {
        self.limits
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits a new connection from `source`, or says why not.
    pub fn admit(self: &Arc<Self>, source: Source) -> Result<Admitted, Refusal> {
        let l = self.limits;
        let pending_cap = l
            .max_connections
            .saturating_sub(l.authenticated_reserve)
            .max(1);
        let mut s = self.lock();
        if s.per_source.get(&source).copied().unwrap_or(0) >= l.max_per_source {
            return Err(Refusal::PerSource);
        }
        let mut evicted_another = false;
        if s.open >= l.max_connections || s.pending.len() >= pending_cap {
            if l.authenticated_reserve == 0 {
                return Err(Refusal::Full);
            }
            let Some(&oldest) = s.pending.keys().next() else {
                return Err(Refusal::Full);
            };
            if let Some(p) = s.forget_pending(oldest) {
                s.open -= 1;
                p.evict.cancel();
                evicted_another = true;
            }
        }
        let id = s.next_id;
        s.next_id += 1;
        s.open += 1;
        *s.per_source.entry(source).or_insert(0) += 1;
        let evicted = CancellationToken::new();
        s.pending.insert(
            id,
            Pending {
                source,
                evict: evicted.clone(),
            },
        );
        Ok(Admitted {
            slot: Slot {
                limiter: self.clone(),
                id,
                evicted,
            },
            evicted_another,
        })
    }

    /// Whether `slot` counts as authenticated.
    pub fn is_authenticated(&self, slot: &Slot) -> bool {
        self.lock().authenticated.contains_key(&slot.id)
    }

    /// (open, pending) connections now.
    pub fn counts(&self) -> (usize, usize) {
        let s = self.lock();
        (s.open, s.pending.len())
    }
}

impl Slot {
    /// A request on this connection was authorized as `identity`: it leaves the pending
    /// budget and its source's count for good, unless `identity` already holds
    /// `max_per_identity` authenticated connections (then it stays pending, and `false`).
    /// Idempotent; a connection keeps the first identity it authenticated as.
    pub fn authenticated(&self, identity: &str) -> bool {
        let mut s = self.limiter.lock();
        if s.authenticated.contains_key(&self.id) {
            return true;
        }
        if !s.pending.contains_key(&self.id) {
            return false; // evicted
        }
        let held = s.per_identity.get(identity).copied().unwrap_or(0);
        if held >= self.limiter.limits.max_per_identity {
            return false;
        }
        s.forget_pending(self.id);
        let who: std::sync::Arc<str> = identity.into();
        *s.per_identity.entry(who.clone()).or_insert(0) += 1;
        s.authenticated.insert(self.id, who);
        true
    }

    /// Cancelled when this connection is evicted to make room for a new one.
    pub fn evicted(&self) -> &CancellationToken {
        &self.evicted
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut s = self.limiter.lock();
        // An evicted connection's slot was given back at its eviction.
        let authenticated = s.forget_authenticated(self.id);
        if s.forget_pending(self.id).is_some() || authenticated || !self.evicted.is_cancelled() {
            s.open -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(n: u8) -> Source {
        Source::of(IpAddr::from([10, 0, 0, n]))
    }

    fn limiter(max: usize, per_source: usize, reserve: usize) -> Arc<Limiter> {
        Limiter::new(ConnLimits {
            max_connections: max,
            max_per_source: per_source,
            authenticated_reserve: reserve,
            max_per_identity: usize::MAX,
        })
    }

    #[test]
    fn sources_are_addresses_and_ipv6_64s() {
        let v6 = |s: &str| Source::of(s.parse().unwrap());
        assert_eq!(v6("2001:db8:1:2::1"), v6("2001:db8:1:2:ffff::9"));
        assert_ne!(v6("2001:db8:1:2::1"), v6("2001:db8:1:3::1"));
        assert_eq!(
            v6("::ffff:10.0.0.1"),
            src(1),
            "IPv4-mapped is the IPv4 source"
        );
        assert_ne!(src(1), src(2));
    }

    #[test]
    fn one_source_holds_at_most_its_cap_of_pending_connections() {
        let l = limiter(100, 3, 10);
        let held: Vec<_> = (0..3).map(|_| l.admit(src(1)).unwrap()).collect();
        assert_eq!(l.admit(src(1)).err(), Some(Refusal::PerSource));
        // Other sources are not affected.
        let other = l.admit(src(2)).unwrap();
        // An authenticated connection no longer counts against its source.
        held[0].slot.authenticated("user");
        held[0].slot.authenticated("user");
        let again = l.admit(src(1)).unwrap();
        assert_eq!(l.admit(src(1)).err(), Some(Refusal::PerSource));
        // A closed one gives its place back.
        drop(held);
        assert!(l.admit(src(1)).is_ok());
        drop((other, again));
        assert_eq!(l.counts(), (0, 0), "every slot is given back");
    }

    #[test]
    fn pending_connections_cannot_take_the_reserve_and_the_oldest_makes_room() {
        // 4 slots, 2 kept for authenticated connections.
        let l = limiter(4, 10, 2);
        let a = l.admit(src(1)).unwrap();
        let b = l.admit(src(2)).unwrap();
        assert!(!a.evicted_another && !b.evicted_another);
        // The pending budget (2) is full: the oldest pending one (a) is evicted.
        let c = l.admit(src(3)).unwrap();
        assert!(c.evicted_another);
        assert!(a.slot.evicted().is_cancelled());
        assert!(!b.slot.evicted().is_cancelled());
        assert_eq!(l.counts(), (2, 2));
        drop(a);
        assert_eq!(
            l.counts(),
            (2, 2),
            "an evicted slot is not given back twice"
        );
        // c authenticates: it may use the reserve; two pending ones fit beside it again.
        c.slot.authenticated("user");
        let d = l.admit(src(4)).unwrap();
        assert!(!d.evicted_another);
        assert_eq!(l.counts(), (3, 2));
        // Authenticated connections are never evicted.
        d.slot.authenticated("user");
        b.slot.authenticated("user");
        let e = l.admit(src(5)).unwrap();
        assert!(!e.evicted_another);
        assert_eq!(l.counts(), (4, 1));
        // Every slot held: the pending one makes room, the authenticated ones stay.
        let f = l.admit(src(6)).unwrap();
        assert!(f.evicted_another && e.slot.evicted().is_cancelled());
        for s in [&b.slot, &c.slot, &d.slot] {
            assert!(!s.evicted().is_cancelled());
        }
        // All authenticated and full: refused.
        f.slot.authenticated("user");
        assert_eq!(l.admit(src(7)).err(), Some(Refusal::Full));
        drop((b, c, d, e, f));
        assert_eq!(l.counts(), (0, 0));
    }

    #[test]
    fn one_identity_cannot_hold_every_authenticated_slot() {
        // 10 slots, 2 kept for authenticated connections, 3 per identity.
        let l = Limiter::new(ConnLimits {
            max_connections: 10,
            max_per_source: 100,
            authenticated_reserve: 2,
            max_per_identity: 3,
        });
        // One client with a valid credential opens connection after connection.
        let mut mallory = Vec::new();
        for i in 0..8 {
            let a = l.admit(src(9)).unwrap();
            let authed = a.slot.authenticated("mallory");
            assert_eq!(
                authed,
                i < 3,
                "connection {i}: only 3 count as authenticated"
            );
            mallory.push(a);
        }
        assert_eq!(l.counts(), (8, 5), "the other 5 stay pending");
        // The apiserver still gets in: its authenticated connections use the reserve, and
        // once every slot is held a pending connection of mallory's is evicted for each. Its
        // own identity has the same cap: the fourth stays pending.
        let mut apiserver = Vec::new();
        for i in 0..4 {
            let a = l.admit(src(1)).unwrap();
            let authed = a.slot.authenticated("kube-apiserver-kubelet-client");
            assert_eq!(authed, i < 3, "apiserver connection {i}");
            apiserver.push(a);
        }
        let evicted = mallory
            .iter()
            .filter(|a| a.slot.evicted().is_cancelled())
            .count();
        assert_eq!(evicted, 2, "two of mallory's pending connections made room");
        assert!(
            mallory[..3]
                .iter()
                .all(|a| !a.slot.evicted().is_cancelled())
        );
        // Mallory's authenticated ones closing lets its others count again.
        drop(mallory.remove(0));
        let pending_one = mallory
            .iter()
            .find(|a| !a.slot.evicted().is_cancelled() && !l.is_authenticated(&a.slot))
            .unwrap();
        assert!(pending_one.slot.authenticated("mallory"));
        drop((mallory, apiserver));
        assert_eq!(l.counts(), (0, 0), "every slot is given back");
    }

    #[test]
    fn without_a_reserve_a_full_server_refuses() {
        let l = limiter(2, usize::MAX, 0);
        let a = l.admit(src(1)).unwrap();
        let _b = l.admit(src(1)).unwrap();
        assert_eq!(l.admit(src(2)).err(), Some(Refusal::Full));
        assert!(!a.slot.evicted().is_cancelled());
        drop(a);
        assert!(l.admit(src(2)).is_ok());
    }
}
