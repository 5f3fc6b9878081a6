use super::*;

fn manager(records: &Arc<FakeRecords>, range: (u32, u32), max_pods: u32) -> UsernsManager {
    UsernsManager::new(records.clone(), u64::from(UNIT), range, max_pods).unwrap()
}

fn first_id(ns: &UserNamespace) -> u32 {
    ns.uids[0].host_id
}

#[test]
fn pods_get_ranges_that_never_overlap_and_root_is_never_mapped() {
    let records = Arc::new(FakeRecords::default());
    let m = manager(&records, (DEFAULT_FIRST_ID, DEFAULT_LENGTH), 110);
    let mut firsts = Vec::new();
    for i in 0..50 {
        let ns = m.get_or_create(&format!("pod-{i}"), "", true).unwrap();
        assert_eq!(ns.uids, ns.gids);
        assert_eq!(ns.uids.len(), 1);
        assert_eq!(ns.uids[0].container_id, 0);
        assert_eq!(ns.uids[0].length, UNIT);
        assert!(
            first_id(&ns) >= UNIT,
            "the node's IDs below 65536 stay unmapped"
        );
        firsts.push(first_id(&ns));
    }
    firsts.sort();
    assert!(firsts.windows(2).all(|w| w[1] - w[0] >= UNIT), "{firsts:?}");
    // Asking again gives the same range.
    let again = m.get_or_create("pod-7", "", true).unwrap();
    assert_eq!(Some(again.clone()), m.mapping("pod-7"));
    assert_eq!(m.allocated(), 50);
    // The record is upstream's JSON.
    let rec = records.read("pod-7").unwrap().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&rec).unwrap();
    assert_eq!(
        v,
        serde_json::json!({
            "uidMappings": [{"hostId": first_id(&again), "containerId": 0, "length": 65536}],
            "gidMappings": [{"hostId": first_id(&again), "containerId": 0, "length": 65536}],
        })
    );
}

#[test]
fn a_restarted_agent_gives_each_pod_its_recorded_range_and_new_pods_other_ones() {
    let records = Arc::new(FakeRecords::default());
    let m = manager(&records, (DEFAULT_FIRST_ID, DEFAULT_LENGTH), 110);
    let a = m.get_or_create("a", "", true).unwrap();
    let b = m.get_or_create("b", "", true).unwrap();
    m.release("a");
    let c = m.get_or_create("c", "", true).unwrap();
    drop(m);
    // A pod directory without a record (a pod in the node's user namespace) is fine.
    records.dirs.lock().unwrap().insert("plain".into(), None);
    let m = manager(&records, (DEFAULT_FIRST_ID, DEFAULT_LENGTH), 110);
    assert_eq!(m.allocated(), 2);
    assert_eq!(m.mapping("b"), Some(b.clone()));
    assert_eq!(m.mapping("c"), Some(c.clone()));
    assert_eq!(m.mapping("a"), None, "a released range is not rebuilt");
    assert_eq!(m.get_or_create("b", "", true).unwrap(), b);
    let d = m.get_or_create("d", "", true).unwrap();
    for other in [&b, &c] {
        assert_ne!(first_id(&d), first_id(other));
    }
    // a's range was free again and is reused by someone.
    assert!([first_id(&c), first_id(&d)].contains(&first_id(&a)));
}

#[test]
fn exhaustion_gives_upstreams_message_and_a_release_frees_a_range() {
    let records = Arc::new(FakeRecords::default());
    // Room for exactly two pods.
    let m = manager(&records, (UNIT, 2 * UNIT), 2);
    m.get_or_create("a", "", true).unwrap();
    m.get_or_create("b", "", true).unwrap();
    let err = m.get_or_create("c", "", true).unwrap_err();
    assert_eq!(
        err.to_string(),
        "create user namespace: could not find an empty slot to allocate a user namespace"
    );
    assert!(records.read("c").unwrap().is_none());
    m.release("a");
    assert!(
        records.read("a").unwrap().is_none(),
        "the record goes with the range"
    );
    assert_eq!(first_id(&m.get_or_create("c", "", true).unwrap()), UNIT);
}

#[test]
fn a_runtime_handler_without_support_is_refused_with_upstreams_message() {
    let records = Arc::new(FakeRecords::default());
    let m = manager(&records, (DEFAULT_FIRST_ID, DEFAULT_LENGTH), 110);
    assert_eq!(
        m.get_or_create("a", "", false).unwrap_err().to_string(),
        "can't set `spec.hostUsers: false`, runtime does not support user namespaces"
    );
    assert_eq!(
        m.get_or_create("a", "kata", false).unwrap_err().to_string(),
        "can't set `spec.hostUsers: false`, RuntimeClass handler \"kata\" does not support user namespaces"
    );
    assert_eq!(m.allocated(), 0, "nothing is allocated for a refused pod");
}

#[test]
fn a_failed_record_write_frees_the_range() {
    let records = Arc::new(FakeRecords::default());
    let m = manager(&records, (UNIT, 2 * UNIT), 2);
    records
        .fail_writes
        .store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(matches!(
        m.get_or_create("a", "", true),
        Err(UsernsError::Io { .. })
    ));
    assert_eq!(m.allocated(), 0);
}

#[test]
fn the_nodes_range_is_checked_with_upstreams_messages() {
    let records: Arc<dyn PodRecords> = Arc::new(FakeRecords::default());
    let new = |per_pod: u64, range: (u32, u32), max: u32| {
        UsernsManager::new(records.clone(), per_pod, range, max)
            .err()
            .map(|e| e.to_string())
    };
    assert_eq!(
        new(1000, (UNIT, 200 * UNIT), 110).unwrap(),
        "kubelet user namespace length 1000 is not a multiple of 65536"
    );
    assert_eq!(
        new(65536, (100_000, 200 * UNIT), 110).unwrap(),
        "kubelet user assigned ID 100000 is not a multiple of 65536"
    );
    assert_eq!(
        new(65536, (0, 200 * UNIT), 110).unwrap(),
        "kubelet user assigned ID 0 must be greater or equal to 65536"
    );
    assert_eq!(
        new(65536, (UNIT, 200 * UNIT + 5), 110).unwrap(),
        "kubelet user assigned IDs length 13107205 is not a multiple of 65536"
    );
    assert_eq!(
        new(65536, (UNIT, 100 * UNIT), 110).unwrap(),
        "kubelet user assigned IDs are not enough to support 110 pods"
    );
    assert_eq!(new(2 * 65536, (2 * UNIT, 220 * UNIT), 110), None);
}

#[test]
fn bad_records_stop_the_rebuild_with_the_pod_named() {
    for (record, want) in [
        ("{not json", "invalid user namespace mappings file"),
        (
            r#"{"uidMappings":[{"hostId":65536,"containerId":1,"length":65536}],"gidMappings":[{"hostId":65536,"containerId":1,"length":65536}]}"#,
            "UID 0 must be mapped",
        ),
        (
            r#"{"uidMappings":[{"hostId":65536,"containerId":0,"length":65536}],"gidMappings":[{"hostId":131072,"containerId":0,"length":65536}]}"#,
            "GID and UID mapping should be identical",
        ),
        (
            r#"{"uidMappings":[{"hostId":0,"containerId":0,"length":65536}],"gidMappings":[{"hostId":0,"containerId":0,"length":65536}]}"#,
            "id 0 is out of range",
        ),
    ] {
        let records = Arc::new(FakeRecords::default());
        records
            .dirs
            .lock()
            .unwrap()
            .insert("p1".into(), Some(record.as_bytes().to_vec()));
        let err = UsernsManager::new(records, 65536, (UNIT, 200 * UNIT), 110)
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.starts_with("record pod mappings for existing pod \"p1\""),
            "{err}"
        );
        assert!(err.contains(want), "{err}");
    }
    // Two pods recorded with one range.
    let records = Arc::new(FakeRecords::default());
    let rec = br#"{"uidMappings":[{"hostId":131072,"containerId":0,"length":65536}],"gidMappings":[{"hostId":131072,"containerId":0,"length":65536}]}"#;
    for uid in ["p1", "p2"] {
        records
            .dirs
            .lock()
            .unwrap()
            .insert(uid.into(), Some(rec.to_vec()));
    }
    let err = UsernsManager::new(records, 65536, (UNIT, 200 * UNIT), 110)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("already taken"), "{err}");
}

#[test]
fn subordinate_ids_of_the_kubelet_user_or_the_default() {
    assert_eq!(kubelet_range(None, None).unwrap(), (65536, 4294901760));
    let other = "root:100000:65536\n";
    assert_eq!(
        kubelet_range(Some(other), Some(other)).unwrap(),
        (DEFAULT_FIRST_ID, DEFAULT_LENGTH)
    );
    let mine = "# ranges\nroot:100000:65536\nkubelet:65536:7208960\n";
    assert_eq!(
        kubelet_range(Some(mine), Some(mine)).unwrap(),
        (65536, 7208960)
    );
    assert_eq!(
        kubelet_range(Some(mine), Some(other)).unwrap_err(),
        UsernsError::Mismatched
    );
    let bad = "kubelet:65536:lots\n";
    assert_eq!(
        kubelet_range(Some(bad), Some(bad)).unwrap_err().to_string(),
        "error parsing line \"kubelet:65536:lots\": invalid digit found in string"
    );
    let two = "kubelet:65536:65536\nkubelet:262144:65536\n";
    assert!(
        kubelet_range(Some(two), Some(two))
            .unwrap_err()
            .to_string()
            .ends_with("it must contain only one line")
    );
    let extra = "kubelet:65536:65536:9\n";
    assert_eq!(
        kubelet_range(Some(extra), Some(extra))
            .unwrap_err()
            .to_string(),
        "invalid line \"kubelet:65536:65536:9\""
    );
}

#[test]
fn host_namespaces_are_forbidden_with_a_user_namespace() {
    let pod = |spec: serde_json::Value| -> k8s_openapi::api::core::v1::Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": spec}))
            .unwrap()
    };
    let c = serde_json::json!([{"name": "c", "image": "i"}]);
    assert!(
        validate(&pod(
            serde_json::json!({"hostUsers": false, "containers": c})
        ))
        .is_ok()
    );
    assert!(
        validate(&pod(
            serde_json::json!({"hostUsers": true, "hostNetwork": true, "containers": c})
        ))
        .is_ok()
    );
    assert_eq!(
        validate(&pod(
            serde_json::json!({"hostUsers": false, "hostNetwork": true, "containers": c})
        ))
        .unwrap_err()
        .to_string(),
        "spec.securityContext.hostNetwork: Forbidden: when `pod.Spec.HostUsers` is false"
    );
    let both = validate(&pod(
        serde_json::json!({"hostUsers": false, "hostPID": true, "hostIPC": true, "containers": c}),
    ))
    .unwrap_err()
    .to_string();
    assert!(
        both.contains("HostPID: Forbidden") && both.contains("HostIPC: Forbidden"),
        "{both}"
    );
}
