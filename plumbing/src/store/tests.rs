use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher::Event;

use super::*;

fn map(items: &[(&str, u32)]) -> HashMap<String, u32> {
    items.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

#[test]
fn the_journal_names_the_keys_changed_since_a_position() {
    let s: Store<u32> = Store::with_journal(3);
    s.replace(map(&[("a", 1)]));
    let p = s.position();
    assert_eq!(s.changed_since(p), (p, Changed::Keys(BTreeSet::new())));
    s.apply("b".into(), 2);
    s.delete("a");
    s.apply("b".into(), 3);
    let (next, changed) = s.changed_since(p);
    assert_eq!(
        changed,
        Changed::Keys(BTreeSet::from(["a".to_string(), "b".to_string()]))
    );
    assert_eq!(next, s.position());
    // A fresh list since: everything.
    s.replace(HashMap::new());
    assert_eq!(s.changed_since(next).1, Changed::All);
    // Further back than the journal reaches: everything.
    let p = s.position();
    for k in ["x", "y", "z", "w"] {
        s.apply(k.into(), 0);
    }
    assert_eq!(s.changed_since(p).1, Changed::All);
    assert!(matches!(s.changed_since(s.position() - 3).1, Changed::Keys(k) if k.len() == 3));
    // A store without a journal always says everything.
    let plain: Store<u32> = Store::default();
    plain.apply("a".into(), 1);
    assert_eq!(plain.changed_since(0).1, Changed::All);
}

#[test]
fn relist_deletes_vanished_and_skips_unchanged() {
    let s: Store<u32> = Store::default();
    assert!(!s.has_synced());
    let c = s.replace(map(&[("default/a", 1), ("default/b", 1)]));
    assert!(s.has_synced());
    assert_eq!(c, vec![Change::Upsert(1), Change::Upsert(1)]);
    assert_eq!(
        s.apply("default/a".into(), 1),
        None,
        "unchanged apply is dropped"
    );
    assert_eq!(s.apply("default/a".into(), 2), Some(Change::Upsert(2)));
    assert_eq!(s.apply("default/c".into(), 7), Some(Change::Upsert(7)));

    // Re-list: a unchanged, b changed, c vanished, d new.
    let c = s.replace(map(&[("default/a", 2), ("default/b", 3), ("default/d", 4)]));
    assert_eq!(
        c,
        vec![Change::Delete(7), Change::Upsert(3), Change::Upsert(4)]
    );
    assert_eq!(s.len(), 3);

    // Deletes carry the version the store held; unknown deletes are dropped.
    assert_eq!(s.delete("default/b"), Some(Change::Delete(3)));
    assert_eq!(s.delete("default/b"), None);

    // A listed object that could not be read keeps its version.
    let kept = std::collections::HashSet::from(["default/a".to_string()]);
    let c = s.replace_keeping(HashMap::new(), &kept);
    assert_eq!(c, vec![Change::Delete(4)]);
    assert_eq!(s.get("default/a"), Some(2));
}

#[test]
fn a_relist_delivers_in_namespace_then_name_order() {
    let s: Store<u32> = Store::default();
    // "a-b/x" sorts before "a/z" as a string, after it by (namespace, name).
    let c = s.replace(map(&[("a-b/x", 1), ("a/z", 2), ("node", 3)]));
    assert_eq!(
        c,
        vec![Change::Upsert(3), Change::Upsert(2), Change::Upsert(1)]
    );
}

/// Readers hear of every write, also one that changed nothing: a re-list after an apiserver
/// outage is how the kubelet's status writer learns to retry at once.
#[test]
fn readers_are_woken_by_every_write() {
    let s: Store<u32> = Store::default();
    let mut rx = s.subscribe();
    s.replace(map(&[("a", 1)]));
    assert!(rx.has_changed().unwrap(), "the first list wakes readers");
    rx.borrow_and_update();
    assert_eq!(s.replace(map(&[("a", 1)])), vec![], "nothing changed");
    assert!(
        rx.has_changed().unwrap(),
        "an unchanged re-list wakes readers"
    );
    rx.borrow_and_update();
    assert_eq!(s.apply("a".into(), 1), None);
    assert!(rx.has_changed().unwrap(), "so does an unchanged apply");
    rx.borrow_and_update();
    assert_eq!(s.delete("nothing"), None);
    assert!(rx.has_changed().unwrap(), "and a delete of nothing");
}

/// Keeps a ConfigMap's `data["v"]` as a number; an object labelled `skip` is not kept.
#[derive(Debug, Default)]
struct Numbers {
    log: Vec<String>,
    synced: usize,
}

impl Sink<ConfigMap> for Numbers {
    type Item = u32;
    type Error = String;
    fn kind(&self) -> &'static str {
        "ConfigMap"
    }
    fn decode(&self, cm: ConfigMap) -> Result<Option<u32>, String> {
        if cm.metadata.labels.is_some_and(|l| l.contains_key("skip")) {
            return Ok(None);
        }
        let v = cm.data.unwrap_or_default().remove("v").unwrap_or_default();
        v.parse().map(Some).map_err(|e| format!("{v:?}: {e}"))
    }
    fn upsert(&mut self, item: &u32) {
        self.log.push(format!("+{item}"));
    }
    fn delete(&mut self, item: &u32) {
        self.log.push(format!("-{item}"));
    }
    fn synced(&mut self) {
        self.synced += 1;
    }
}

fn cm(name: &str, v: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "metadata": {"namespace": "ns", "name": name},
        "data": {"v": v},
    }))
    .unwrap()
}

fn log(r: &mut Reflector<ConfigMap, Numbers>) -> Vec<String> {
    std::mem::take(&mut r.sink_mut().log)
}

#[test]
fn the_reflector_skips_malformed_objects_and_drops_what_it_does_not_keep() {
    let store = Arc::new(Store::default());
    let mut r = Reflector::new(store.clone(), Numbers::default());
    r.handle(Event::Init);
    r.handle(Event::InitApply(cm("a", "1")));
    r.handle(Event::InitApply(cm("bad", "one")));
    r.handle(Event::InitApply(cm("b", "2")));
    assert!(!store.has_synced(), "nothing before the list is complete");
    assert!(log(&mut r).is_empty());
    r.handle(Event::InitDone);
    assert_eq!(log(&mut r), ["+1", "+2"]);
    assert_eq!((store.len(), r.sink().synced), (2, 1));

    // A malformed update keeps the old version; an unchanged one is not delivered.
    r.handle(Event::Apply(cm("a", "x")));
    r.handle(Event::Apply(cm("a", "1")));
    assert!(log(&mut r).is_empty());
    assert_eq!(store.get("ns/a"), Some(1));
    // An object the sink does not keep any more is deleted.
    let mut skipped = cm("b", "2");
    skipped.metadata.labels = Some([("skip".to_string(), String::new())].into());
    r.handle(Event::Apply(skipped));
    assert_eq!(log(&mut r), ["-2"]);

    // A re-list: a malformed listed object keeps its version; synced is said once.
    r.handle(Event::Apply(cm("c", "3")));
    r.handle(Event::Init);
    r.handle(Event::InitApply(cm("a", "oops")));
    r.handle(Event::InitDone);
    assert_eq!(log(&mut r), ["+3", "-3"]);
    assert_eq!(store.get("ns/a"), Some(1));
    assert_eq!(r.sink().synced, 1);

    // A delete carries the version the store held.
    r.handle(Event::Delete(cm("a", "anything")));
    assert_eq!(log(&mut r), ["-1"]);
    assert!(store.is_empty());
}
