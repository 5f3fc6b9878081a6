use super::*;
use k8s_openapi::api::core::v1::Pod;
use std::collections::{BTreeMap, BTreeSet};
use walk::SchemaField;

fn schema() -> Vec<SchemaField> {
    walk::schema_fields::<Pod>().expect("the Pod schema walks")
}

/// The fields that need an entry: every field of `Pod`, and of each type held by a handled
/// field (refused and elsewhere fields are decided as a whole).
fn required(schema: &[SchemaField]) -> Vec<&SchemaField> {
    let entries: BTreeMap<(&str, &str), Fate> = table::TABLE
        .iter()
        .map(|e| ((e.owner, e.field), e.fate))
        .collect();
    let mut types = vec!["Pod"];
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    while let Some(t) = types.pop() {
        if !seen.insert(t) {
            continue;
        }
        for f in schema.iter().filter(|f| f.owner == t) {
            out.push(f);
            if let (Some(Fate::Handled(_)), Some(child)) =
                (entries.get(&(f.owner, f.name)), f.child)
            {
                types.push(child);
            }
        }
    }
    out
}

#[test]
fn the_walk_sees_every_field_by_its_wire_name() {
    let s = schema();
    let has = |o: &str, f: &str| s.iter().any(|x| x.owner == o && x.name == f);
    assert!(has("Pod", "spec") && has("PodSpec", "shareProcessNamespace"));
    assert!(has("VolumeMount", "mountPropagation") && has("VolumeMount", "subPathExpr"));
    assert!(has("Volume", "image") && has("ImageVolumeSource", "pullPolicy"));
    let m = s
        .iter()
        .find(|x| x.owner == "VolumeMount" && x.name == "recursiveReadOnly")
        .unwrap();
    assert_eq!(m.path, "spec.containers[].volumeMounts[].recursiveReadOnly");
    assert_eq!(
        s.iter()
            .find(|x| x.owner == "PodSpec" && x.name == "containers")
            .unwrap()
            .child,
        Some("Container")
    );
    // A type the walk meets twice (Probe, Container) is listed once.
    let pairs: BTreeSet<_> = s.iter().map(|x| (x.owner, x.name)).collect();
    assert_eq!(pairs.len(), s.len());
}

/// The guard: a field of `v1.Pod` without an entry (a new k8s-openapi release adding one)
/// fails here, and so does an entry for a field that is gone or no longer reachable.
#[test]
fn every_pod_field_has_an_entry() {
    let s = schema();
    let need = required(&s);
    let listed: BTreeSet<(&str, &str)> = table::TABLE.iter().map(|e| (e.owner, e.field)).collect();
    let missing: Vec<String> = need
        .iter()
        .filter(|f| !listed.contains(&(f.owner, f.name)))
        .map(|f| format!("{}.{} (at {})", f.owner, f.name, f.path))
        .collect();
    assert!(
        missing.is_empty(),
        "pod fields with no entry in kubelet/src/pod/admission/fields/table.rs: handle, refuse \
         or place each one:\n  {}",
        missing.join("\n  ")
    );
    let needed: BTreeSet<(&str, &str)> = need.iter().map(|f| (f.owner, f.name)).collect();
    let stale: Vec<String> = table::TABLE
        .iter()
        .filter(|e| !needed.contains(&(e.owner, e.field)))
        .map(|e| format!("{}.{}", e.owner, e.field))
        .collect();
    assert!(
        stale.is_empty(),
        "entries for no reachable field: {stale:?}"
    );
    let mut dup = BTreeSet::new();
    for e in table::TABLE {
        assert!(
            dup.insert((e.owner, e.field)),
            "{}.{} listed twice",
            e.owner,
            e.field
        );
    }
}

fn sources() -> String {
    fn read(dir: &std::path::Path, out: &mut String) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let p = entry.path();
            if p.is_dir() {
                read(&p, out);
            } else if p.extension().is_some_and(|e| e == "rs") {
                out.push_str(&std::fs::read_to_string(&p).unwrap());
            }
        }
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut s = String::new();
    for d in ["kubelet/src", "probes/src", "tests/tests"] {
        read(&root.join(d), &mut s);
    }
    s
}

#[test]
fn every_named_test_exists() {
    let src = sources();
    let mut absent = Vec::new();
    for e in table::TABLE {
        let t = match e.fate {
            Fate::Handled(t) | Fate::Refused(_, t) => t,
            _ => continue,
        };
        if t.is_empty() && matches!(e.fate, Fate::Refused(..)) {
            continue;
        }
        if !src.contains(&format!("fn {t}(")) {
            absent.push(format!("{}.{}: {t}", e.owner, e.field));
        }
    }
    assert!(
        absent.is_empty(),
        "tests named in the table that do not exist: {absent:#?}"
    );
}

#[test]
fn every_refusal_is_what_its_example_gets() {
    let s = schema();
    let plain = crate::podspec::test_pod("p", "u0", serde_json::json!({}));
    assert_eq!(refusal(&plain), None);
    for (i, r) in refuse::REFUSALS.iter().enumerate() {
        assert!(
            s.iter().any(|f| f.owner == r.owner && f.name == r.field),
            "refusal for {}.{}: no such field",
            r.owner,
            r.field
        );
        let example: serde_json::Value = serde_json::from_str(r.example).unwrap();
        let uid = format!("u{}", i + 1);
        let pod = crate::podspec::test_pod("p", &uid, example);
        assert_eq!(
            refusal(&pod),
            Some((r.reason, r.message)),
            "{}.{}",
            r.owner,
            r.field
        );
        // Admission turns it into the pod's rejection.
        let mut admission = crate::pod::admission::Admission::default();
        let rejected = admission.admit(std::slice::from_ref(&pod), 110, None, "n1");
        assert_eq!(rejected.len(), 1, "{}.{} admitted", r.owner, r.field);
        assert_eq!(rejected[0].1.reason, r.reason);
        assert_eq!(rejected[0].1.message, r.message);
    }
    // A field refused at admission as a whole has its refusal.
    for e in table::TABLE {
        if let Fate::Refused(m, "") = e.fate {
            assert!(
                refuse::REFUSALS
                    .iter()
                    .any(|r| r.owner == e.owner && r.field == e.field && r.message == m),
                "{}.{} is refused at admission but has no refusal",
                e.owner,
                e.field
            );
        }
    }
}

#[test]
fn values_that_are_provided_are_not_refused() {
    for spec in [
        serde_json::json!({"os": {"name": "linux"}, "shareProcessNamespace": false, "setHostnameAsFQDN": false}),
        serde_json::json!({"initContainers": [{"name": "s", "image": "i", "restartPolicy": "Always"}]}),
        serde_json::json!({"containers": [{"name": "c", "image": "i", "volumeMounts": [
            {"name": "v", "mountPath": "/m", "mountPropagation": "HostToContainer", "subPathExpr": "$(A)"},
            {"name": "v", "mountPath": "/r", "readOnly": true, "recursiveReadOnly": "IfPossible"}]}],
            "volumes": [{"name": "v", "emptyDir": {"medium": "Memory"}}, {"name": "h", "emptyDir": {"medium": "HugePages-2Mi"}}]}),
    ] {
        let pod = crate::podspec::test_pod("p", "u", spec.clone());
        assert_eq!(refusal(&pod), None, "{spec}");
    }
}

#[test]
fn pod_fields_doc() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/pod-fields.md");
    let want = super::pod_fields_doc();
    if std::env::var_os("UPDATE_POD_FIELDS_DOC").is_some() {
        std::fs::write(&path, &want).unwrap();
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "docs/pod-fields.md is stale. Regenerate it: UPDATE_POD_FIELDS_DOC=1 cargo test -p kubelet pod_fields_doc"
    );
}
