use std::collections::HashSet;

use super::*;

fn net(s: &str) -> Cidr {
    s.parse().unwrap()
}

#[test]
fn hands_out_distinct_addresses_after_the_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(dir.path().join("net"));
    let subnets = [net("10.244.1.0/24")];
    let lock = store.lock().unwrap();
    let a = lock.allocate("c1", "eth0", &subnets).unwrap();
    let b = lock.allocate("c2", "eth0", &subnets).unwrap();
    assert_eq!(a, vec![net("10.244.1.2/24")]);
    assert_eq!(b, vec![net("10.244.1.3/24")]);
    // A repeated ADD of the same attachment gets its address back, not a second one.
    assert_eq!(lock.allocate("c1", "eth0", &subnets).unwrap(), a);
    assert_eq!(lock.get("c2", "eth0", &subnets).unwrap(), b);
}

#[test]
fn allocations_survive_a_restart_and_freed_addresses_wait_their_turn() {
    let dir = tempfile::tempdir().unwrap();
    let subnets = [net("10.244.1.0/24")];
    {
        let store = Store::new(dir.path().join("net"));
        let lock = store.lock().unwrap();
        lock.allocate("c1", "eth0", &subnets).unwrap();
        lock.allocate("c2", "eth0", &subnets).unwrap();
    }
    let store = Store::new(dir.path().join("net"));
    let lock = store.lock().unwrap();
    assert_eq!(
        lock.get("c1", "eth0", &subnets).unwrap(),
        vec![net("10.244.1.2/24")]
    );
    assert_eq!(
        lock.release("c1", "eth0").unwrap(),
        vec!["10.244.1.2".parse::<IpAddr>().unwrap()]
    );
    assert!(
        lock.release("c1", "eth0").unwrap().is_empty(),
        "a second release frees nothing"
    );
    // .2 is free again, but the next address comes after the last one handed out.
    assert_eq!(
        lock.allocate("c3", "eth0", &subnets).unwrap(),
        vec![net("10.244.1.4/24")]
    );
}

#[test]
fn dual_stack_gets_one_address_per_family_and_small_subnets_run_out() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(dir.path().join("net"));
    let lock = store.lock().unwrap();
    let got = lock
        .allocate("c1", "eth0", &[net("10.0.0.0/30"), net("fd00::/120")])
        .unwrap();
    assert_eq!(got, vec![net("10.0.0.2/30"), net("fd00::2/120")]);
    assert!(!lock.has_free(&[net("10.0.0.0/30")]).unwrap());
    let err = lock
        .allocate("c2", "eth0", &[net("10.0.0.0/30"), net("fd00::/120")])
        .unwrap_err();
    assert_eq!(err.code(), 100);
    // The failed ADD left no IPv6 allocation behind.
    assert!(
        lock.get("c2", "eth0", &[net("fd00::/120")])
            .unwrap()
            .is_empty()
    );
    let freed = lock.retain(&[]).unwrap();
    assert_eq!(freed.len(), 2);
    assert!(lock.has_free(&[net("10.0.0.0/30")]).unwrap());
}

#[test]
fn concurrent_adds_never_share_an_address() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("net");
    let subnets = [net("10.244.1.0/24")];
    let all: Vec<Cidr> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|t| {
                let path = path.clone();
                s.spawn(move || {
                    let mut mine = Vec::new();
                    for i in 0..10 {
                        let store = Store::new(&path);
                        let lock = store.lock().unwrap();
                        mine.extend(
                            lock.allocate(&format!("c{t}-{i}"), "eth0", &subnets)
                                .unwrap(),
                        );
                    }
                    mine
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    assert_eq!(all.len(), 80);
    assert_eq!(
        all.iter().collect::<HashSet<_>>().len(),
        80,
        "an address was handed out twice"
    );
}
