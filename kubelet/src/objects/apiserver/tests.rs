use std::sync::Mutex;

use kube::runtime::watcher::Event;

use super::*;

fn cm(v: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "metadata": {"namespace": "ns", "name": "cfg", "uid": "u1"},
        "data": {"k": v},
    }))
    .unwrap()
}

/// What a followed ConfigMap's watch reports, event by event: `None` when it does not
/// exist, its value when it does; nothing when a re-list finds it unchanged.
#[test]
fn a_followed_object_reports_each_state_once() {
    let seen: Mutex<Vec<Option<String>>> = Mutex::default();
    let on_change = |d: Option<ObjectData>| {
        seen.lock().unwrap().push(d.map(|d| d.text["k"].clone()));
    };
    let mut r = Reflector::new(
        Arc::new(Store::default()),
        Follow {
            kind: Kind::ConfigMap,
            convert: ObjectData::from_config_map,
            on_change: &on_change,
            present: false,
        },
    );
    let take = || std::mem::take(&mut *seen.lock().unwrap());
    // Listed and absent: it does not exist (a pod waiting for it learns so at once).
    r.handle(Event::Init);
    r.handle(Event::InitDone);
    assert_eq!(take(), [None]);
    r.handle(Event::Apply(cm("a")));
    r.handle(Event::Apply(cm("b")));
    assert_eq!(take(), [Some("a".into()), Some("b".into())]);
    // A re-list that finds it as it was says nothing; one that misses it says it is gone.
    r.handle(Event::Init);
    r.handle(Event::InitApply(cm("b")));
    r.handle(Event::InitDone);
    assert_eq!(take(), Vec::<Option<String>>::new());
    r.handle(Event::Init);
    r.handle(Event::InitDone);
    assert_eq!(take(), [None]);
    // Created again, then deleted.
    r.handle(Event::Apply(cm("c")));
    r.handle(Event::Delete(cm("c")));
    assert_eq!(take(), [Some("c".into()), None]);
}
