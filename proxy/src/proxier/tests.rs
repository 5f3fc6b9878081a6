//! The generic proxier against a recording fake backend: the full-sync decision, what a
//! failure forgets, the canary, what a success records.

use std::sync::{Arc, Mutex};

use prometheus::Registry;

use super::*;
use crate::tests::{loaded_state, render_cfg};

/// What the fake backend saw, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seen {
    Observe {
        full: bool,
        known: bool,
    },
    Plan {
        full: bool,
        known: bool,
        changed: usize,
    },
    Apply {
        full: bool,
    },
}

#[derive(Clone, Default)]
struct Fake {
    seen: Arc<Mutex<Vec<Seen>>>,
    /// The next apply fails.
    fail: Arc<Mutex<bool>>,
    /// The canary finds the rules changed.
    flushed: Arc<Mutex<bool>>,
    /// Whether the next failure forgets what is known.
    forget: bool,
}

impl Fake {
    fn take(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
}

#[derive(Debug)]
struct Failed;

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("injected")
    }
}

impl Backend for Fake {
    type Error = Failed;
    /// The number of syncs applied.
    type Known = u32;
    type Observed = ();
    /// The service ports planned.
    type Plan = usize;
    type Written = usize;

    const NAME: &'static str = "fake";

    async fn check_canary(&self, _cfg: &RenderConfig, _known: &mut Option<u32>) -> bool {
        *self.flushed.lock().unwrap()
    }

    async fn observe(&self, _cfg: &RenderConfig, full: bool, known: bool) -> Result<(), Failed> {
        self.seen
            .lock()
            .unwrap()
            .push(Seen::Observe { full, known });
        Ok(())
    }

    fn plan(&self, input: &PlanInput<'_>, known: Option<&mut u32>) -> usize {
        self.seen.lock().unwrap().push(Seen::Plan {
            full: input.full,
            known: known.is_some(),
            changed: input.changed.len(),
        });
        if input.full {
            input.state.service_port_map().len()
        } else {
            input.changed.len()
        }
    }

    async fn apply(
        &mut self,
        plan: usize,
        _observed: (),
        input: ApplyInput<'_>,
        known: &mut Option<u32>,
    ) -> Result<usize, Failed> {
        self.seen
            .lock()
            .unwrap()
            .push(Seen::Apply { full: input.full });
        if std::mem::take(&mut *self.fail.lock().unwrap()) {
            return Err(Failed);
        }
        *known = Some(known.unwrap_or(0) + 1);
        Ok(plan)
    }

    fn succeeded(&mut self, w: &usize, _: Option<&u32>, _: IpFamily, _: &Metrics) -> usize {
        *w
    }

    fn log_synced(&self, _: &usize, _: bool, _: f64) {}

    fn failed(&mut self, _: &Failed, _: bool, _: IpFamily, _: &Metrics) -> bool {
        self.forget
    }
}

fn proxier(fake: Fake) -> Proxier<Fake> {
    let handle = ProxyHandle::new(loaded_state());
    let metrics = Metrics::new(&Registry::new()).unwrap();
    Proxier::with_backend(fake, render_cfg(), handle, SyncConfig::default(), metrics)
}

fn ready(p: &Proxier<Fake>) {
    p.handle().on_services_synced();
    p.handle().on_endpoint_slices_synced();
}

#[tokio::test]
async fn nothing_is_planned_before_the_initial_lists() {
    let fake = Fake::default();
    let mut p = proxier(fake.clone());
    assert_eq!(p.sync(false).await.ok(), Some(SyncOutcome::NotInitialized));
    assert_eq!(fake.take(), []);
    assert!(p.needs_full_sync());
}

#[tokio::test]
async fn first_sync_is_full_then_partial_with_the_known_state() {
    let fake = Fake::default();
    let mut p = proxier(fake.clone());
    ready(&p);
    let out = p.sync(false).await.ok().unwrap();
    assert!(
        matches!(out, SyncOutcome::Applied { full: true, .. }),
        "{out:?}"
    );
    let seen = fake.take();
    assert_eq!(
        seen[0],
        Seen::Observe {
            full: true,
            known: false
        }
    );
    assert!(
        matches!(
            seen[1],
            Seen::Plan {
                full: true,
                known: false,
                ..
            }
        ),
        "{seen:?}"
    );
    assert_eq!(seen[2], Seen::Apply { full: true });
    assert_eq!(p.known(), Some(&1));
    assert!(!p.needs_full_sync());

    // Nothing changed: a partial sync with nothing to write.
    assert_eq!(p.sync(false).await.ok(), Some(SyncOutcome::Unchanged));
    assert_eq!(
        fake.take(),
        [
            Seen::Observe {
                full: false,
                known: true
            },
            Seen::Plan {
                full: false,
                known: true,
                changed: 0
            },
            Seen::Apply { full: false },
        ]
    );
    // Asked for: full.
    let out = p.sync(true).await.ok().unwrap();
    assert!(
        matches!(out, SyncOutcome::Applied { full: true, .. }),
        "{out:?}"
    );
}

#[tokio::test]
async fn a_failure_makes_the_next_sync_full_and_forgets_when_the_backend_says_so() {
    for forget in [false, true] {
        let fake = Fake {
            forget,
            ..Fake::default()
        };
        let mut p = proxier(fake.clone());
        ready(&p);
        p.sync(false).await.ok().unwrap();
        *fake.fail.lock().unwrap() = true;
        assert!(p.sync(false).await.is_err());
        assert!(p.needs_full_sync());
        assert_eq!(p.known().is_none(), forget);
        fake.take();
        let out = p.sync(false).await.ok().unwrap();
        assert!(
            matches!(out, SyncOutcome::Applied { full: true, .. }),
            "{out:?}"
        );
        assert_eq!(
            fake.take()[0],
            Seen::Observe {
                full: true,
                known: !forget
            }
        );
    }
}

#[tokio::test]
async fn a_flushed_canary_makes_the_next_sync_full() {
    let fake = Fake::default();
    let mut p = proxier(fake.clone());
    ready(&p);
    p.sync(false).await.ok().unwrap();
    p.check_canary().await;
    assert!(!p.needs_full_sync(), "canary intact");
    *fake.flushed.lock().unwrap() = true;
    p.check_canary().await;
    assert!(p.needs_full_sync());
    fake.take();
    p.sync(false).await.ok().unwrap();
    assert_eq!(fake.take()[2], Seen::Apply { full: true });
}

#[tokio::test]
async fn a_node_zone_change_makes_the_next_sync_full() {
    let fake = Fake::default();
    let mut p = proxier(fake.clone());
    ready(&p);
    p.sync(false).await.ok().unwrap();
    let mut node = p.handle().with_state(|st| st.node().clone());
    node.zone = Some("zone-b".into());
    p.handle().on_node(node);
    fake.take();
    p.sync(false).await.ok().unwrap();
    assert_eq!(fake.take()[2], Seen::Apply { full: true });
    assert_eq!(p.cfg.zone.as_deref(), Some("zone-b"));
}
