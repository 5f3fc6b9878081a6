use super::*;
use crate::cm::metrics::InstrumentedCgroups;
use crate::runtime::fake::FakeRuntime;
use crate::runtime::instrumented::Instrumented;
use crate::runtime::{Runtime, RuntimeError};
use std::sync::Arc;

fn count(op: &str) -> (u64, u64, f64) {
    let f = families();
    (
        f.runtime_operations_duration
            .with_label_values(&[op])
            .get_sample_count(),
        f.runtime_operations.with_label_values(&[op]).get() as u64,
        f.runtime_operations_errors.with_label_values(&[op]).get(),
    )
}

#[tokio::test]
async fn instrumented_runtime_counts_times_and_errors_each_call() {
    let fake = Arc::new(FakeRuntime::new());
    let rt = Instrumented::new(fake.clone());
    let (d0, n0, e0) = count("version");
    rt.version().await.unwrap();
    fake.fail_next("Version", RuntimeError::Unavailable("down".into()));
    assert!(rt.version().await.is_err());
    let (d1, n1, e1) = count("version");
    // Other tests may call the runtime concurrently: at least our two calls and one error.
    assert!(n1 >= n0 + 2 && d1 >= d0 + 2, "{n0}->{n1}");
    assert!(e1 >= e0 + 1.0);
    let (_, l0, _) = count("list_podsandbox");
    rt.list_sandboxes().await.unwrap();
    assert!(count("list_podsandbox").1 > l0);
}

fn parse(text: &str) -> std::collections::BTreeMap<String, String> {
    // name -> type, from the TYPE lines.
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect()
}

#[tokio::test]
async fn every_family_is_listed_with_its_type_and_alpha_help() {
    let m = Metrics::new("node-a");
    let text = m.render();
    let types = parse(&text);
    for (name, kind) in [
        ("kubelet_node_name", "gauge"),
        ("kubelet_running_pods", "gauge"),
        ("kubelet_running_containers", "gauge"),
        ("kubelet_pod_start_duration_seconds", "histogram"),
        ("kubelet_pod_worker_duration_seconds", "histogram"),
        ("kubelet_started_pods_total", "counter"),
        ("kubelet_started_containers_total", "counter"),
        ("kubelet_runtime_operations_total", "counter"),
        ("kubelet_runtime_operations_errors_total", "counter"),
        ("kubelet_runtime_operations_duration_seconds", "histogram"),
        ("kubelet_pleg_relist_duration_seconds", "histogram"),
        ("kubelet_pleg_relist_interval_seconds", "histogram"),
        ("kubelet_pleg_last_seen_seconds", "gauge"),
        ("kubelet_cgroup_manager_duration_seconds", "histogram"),
        ("kubelet_node_config_error", "gauge"),
        ("kubelet_node_startup_duration_seconds", "gauge"),
        ("kubelet_certificate_manager_client_ttl_seconds", "gauge"),
        (
            "kubelet_certificate_manager_client_expiration_renew_errors",
            "counter",
        ),
        ("kubelet_certificate_manager_server_ttl_seconds", "gauge"),
        ("kubelet_server_expiration_renew_errors", "counter"),
        ("kubelet_evictions", "counter"),
        ("kubelet_eviction_stats_age_seconds", "histogram"),
        ("kubelet_image_garbage_collected_total", "counter"),
        ("volume_manager_total_volumes", "gauge"),
        ("storage_operation_duration_seconds", "histogram"),
        ("storage_operation_errors_total", "counter"),
        ("plugin_manager_total_plugins", "gauge"),
        ("kubelet_credential_provider_plugin_errors", "counter"),
        ("kubelet_credential_provider_plugin_duration", "histogram"),
        ("process_resident_memory_bytes", "gauge"),
        ("process_cpu_seconds_total", "counter"),
        ("rest_client_requests_total", "counter"),
        ("rest_client_request_duration_seconds", "histogram"),
        ("tokio_alive_tasks", "gauge"),
    ] {
        assert_eq!(types.get(name).map(String::as_str), Some(kind), "{name}");
    }
    assert!(text.contains("kubelet_node_name{node=\"node-a\"} 1"));
    assert!(text.contains("# HELP kubelet_running_pods [ALPHA] Number of pods"));
    // Two registries in one process (tests) do not collide.
    let _ = Metrics::new("node-b");
}

#[test]
fn runtime_buckets_are_upstreams_exponential_ones() {
    let b = prometheus::exponential_buckets(0.005, 2.5, 14).unwrap();
    assert_eq!(b.len(), 14);
    assert!((b[1] - 0.0125).abs() < 1e-12);
}

#[test]
fn client_ttl_is_infinite_until_a_certificate_is_known_then_counts_down() {
    // One process-wide gauge: this is the only test that sets it.
    let c = certificates();
    c.set_client_expiry(None);
    assert!(c.client_ttl().is_infinite());
    let in_an_hour = crate::clock::unix_now() + 3600;
    c.set_client_expiry(Some(in_an_hour));
    let ttl = c.client_ttl();
    assert!(ttl > 3590.0 && ttl <= 3600.0, "{ttl}");
    c.set_client_expiry(None);
}

#[test]
fn volume_api_fills_the_storage_families() {
    let v = volumes();
    v.set_total("kubernetes.io/configmap", storage::DESIRED_STATE, 3);
    assert_eq!(
        v.total
            .with_label_values(&["kubernetes.io/configmap", "desired_state_of_world"])
            .get(),
        3.0
    );
    let before = v
        .op_errors
        .with_label_values(&["kubernetes.io/secret", "volume_mount"])
        .get();
    v.observe_op(
        "volume_mount",
        "kubernetes.io/secret",
        false,
        std::time::Duration::from_millis(30),
    );
    let h = v.op_duration.with_label_values(&[
        "kubernetes.io/secret",
        "volume_mount",
        "fail-unknown",
        "false",
    ]);
    assert!(h.get_sample_count() >= 1);
    assert_eq!(
        v.op_errors
            .with_label_values(&["kubernetes.io/secret", "volume_mount"])
            .get(),
        before + 1.0
    );
}

#[test]
fn cgroup_changes_are_timed_as_create_and_destroy_and_still_happen() {
    use crate::cm::{Cgroups, FakeCgroups};
    let fake = Arc::new(FakeCgroups::default());
    let cg = InstrumentedCgroups::new(fake.clone());
    let h = |op: &str| {
        families()
            .cgroup_manager_duration
            .with_label_values(&[op])
            .get_sample_count()
    };
    let (c0, d0) = (h("create"), h("destroy"));
    cg.create("/kubepods/podu1").unwrap();
    assert!(fake.live.lock().unwrap().contains("/kubepods/podu1"));
    cg.remove("/kubepods/podu1").unwrap();
    assert!(fake.live.lock().unwrap().is_empty());
    assert!(h("create") > c0);
    assert!(h("destroy") > d0);
}
