//! ADD latency of node-agent-cni next to Debian's bridge + host-local plugins, measured in
//! the same run on the same kind of namespaces (100 pods each, interleaved). Prints p50/p99
//! and the ratio. Run with:
//! `cargo test -p cni --test bench -- --ignored --nocapture`

use std::path::Path;
use std::time::{Duration, Instant};

use node_tests::netns::cni::{cni_env, run_plugin};
use node_tests::netns::{Netns, can_run};
use serde_json::json;

const PLUGIN: &str = env!("CARGO_BIN_EXE_node-agent-cni");

const PODS: usize = 100;
const DEBIAN_BRIDGE: &str = "/usr/lib/cni/bridge";

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[test]
#[ignore = "benchmark: run with --ignored --nocapture"]
fn add_latency_vs_debian_bridge() {
    if !can_run("add_latency_vs_debian_bridge") {
        return;
    }
    if !Path::new(DEBIAN_BRIDGE).exists() {
        println!(
            "SKIPPED: add_latency_vs_debian_bridge: {DEBIAN_BRIDGE} is missing (containernetworking-plugins)"
        );
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let ours_host = Netns::new("bh-ours");
    let deb_host = Netns::new("bh-deb");
    let ours_conf = json!({
        "cniVersion": "1.0.0", "name": "bench-ours", "type": "node-agent-cni", "bridge": "cni0",
        "mtu": 1500, "ipam": {"subnet": "10.97.0.0/24"}, "dataDir": data.path(),
    })
    .to_string();
    let deb_conf = json!({
        "cniVersion": "1.0.0", "name": "bench-deb", "type": "bridge", "bridge": "cni0",
        "isGateway": true, "hairpinMode": true, "mtu": 1500,
        "ipam": {"type": "host-local", "subnet": "10.97.0.0/24", "dataDir": data.path().join("host-local")},
    })
    .to_string();
    let mut ours = Vec::with_capacity(PODS);
    let mut deb = Vec::with_capacity(PODS);
    let mut pods = Vec::with_capacity(PODS * 2);
    for i in 0..PODS {
        let (a, b) = (Netns::new("bo"), Netns::new("bd"));
        let id = format!("bench{i}");
        let t = Instant::now();
        let (code, out, err) = run_plugin(
            PLUGIN,
            &ours_host.path(),
            &cni_env("ADD", &id, &a.path(), "eth0", "/usr/lib/cni"),
            &ours_conf,
        );
        ours.push(t.elapsed());
        assert_eq!(code, 0, "{out} {err}");
        let t = Instant::now();
        let (code, out, err) = run_plugin(
            DEBIAN_BRIDGE,
            &deb_host.path(),
            &cni_env("ADD", &id, &b.path(), "eth0", "/usr/lib/cni"),
            &deb_conf,
        );
        deb.push(t.elapsed());
        assert_eq!(code, 0, "{out} {err}");
        pods.push(a);
        pods.push(b);
    }
    let (ours_first, deb_first) = (ours[0], deb[0]);
    ours.sort();
    deb.sort();
    let (o50, o99, d50, d99) = (
        percentile(&ours, 0.5),
        percentile(&ours, 0.99),
        percentile(&deb, 0.5),
        percentile(&deb, 0.99),
    );
    println!("ADD latency over {PODS} pods (process start to exit, same run):");
    println!(
        "  node-agent-cni        p50 {:.2} ms  p99 {:.2} ms",
        ms(o50),
        ms(o99)
    );
    println!(
        "  bridge + host-local   p50 {:.2} ms  p99 {:.2} ms",
        ms(d50),
        ms(d99)
    );
    println!(
        "  first ADD (creates the bridge): ours {:.2} ms, debian {:.2} ms; slowest three: ours {:?} ms, debian {:?} ms",
        ms(ours_first),
        ms(deb_first),
        ours[PODS - 3..]
            .iter()
            .map(|d| (ms(*d) * 10.0).round() / 10.0)
            .collect::<Vec<_>>(),
        deb[PODS - 3..]
            .iter()
            .map(|d| (ms(*d) * 10.0).round() / 10.0)
            .collect::<Vec<_>>(),
    );
    println!(
        "  ratio (ours/debian)   p50 {:.2}x    p99 {:.2}x",
        ms(o50) / ms(d50),
        ms(o99) / ms(d99)
    );
}
