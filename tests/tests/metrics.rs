//! `/metrics` as Prometheus scrapes it: the kubelet's `:10250/metrics` and the hosted
//! kube-proxy role's `:10249/metrics`, after the agent joined the test control plane (TLS
//! bootstrap), started a pod from the API and programmed a Service.
//!
//! The exposition is read with a strict parser of the text format (0.0.4) written here: no
//! parser crate or python `prometheus_client` is available on these machines. It refuses
//! samples of undeclared families, malformed labels or values, and histograms whose buckets
//! are not cumulative or whose `+Inf` bucket differs from `_count`.
//!
//! The kubelet's :10250 runs with anonymous authentication and AlwaysAllow authorization here,
//! so that the scrape needs no credentials (kubelet_server_auth.rs tests the Webhook modes).

use node_tests::controlplane::Options;
use node_tests::require_rig;
use node_tests::{Kubelet, NetnsControlPlane, Rig, wait_for};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

const NODE: &str = node_tests::joined::NODE;
const BUSYBOX: &str = "docker.io/library/busybox:1.35";

/// Rigs are heavy (containerd each) and this machine has two cores: one test at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

// ---- a strict parser of the Prometheus text format ----

#[derive(Debug, Default, Clone)]
struct Family {
    kind: String,
    help: String,
    /// (sample name, labels, value)
    samples: Vec<(String, BTreeMap<String, String>, f64)>,
}

fn parse_labels(s: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    let mut rest = s;
    while !rest.is_empty() {
        let (name, after) = rest
            .split_once("=\"")
            .ok_or_else(|| format!("label without =\": {rest}"))?;
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("bad label name {name:?}"));
        }
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c @ ('\\' | '"'))) => value.push(c),
                    other => return Err(format!("bad escape {other:?} in {s}")),
                },
                Some((i, '"')) => break i,
                Some((_, c)) => value.push(c),
                None => return Err(format!("unterminated label value in {s}")),
            }
        };
        if out.insert(name.to_string(), value).is_some() {
            return Err(format!("label {name} twice"));
        }
        rest = &after[end + 1..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
    Ok(out)
}

fn parse_value(s: &str) -> Result<f64, String> {
    match s {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => s.parse().map_err(|e| format!("bad value {s:?}: {e}")),
    }
}

/// The family a sample belongs to (histogram and summary suffixes stripped when declared).
fn family_of<'a>(name: &'a str, fams: &BTreeMap<String, Family>) -> Option<&'a str> {
    if fams.contains_key(name) {
        return Some(name);
    }
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix)
            && fams
                .get(base)
                .is_some_and(|f| f.kind == "histogram" || f.kind == "summary")
        {
            return Some(base);
        }
    }
    None
}

fn parse_exposition(text: &str) -> Result<BTreeMap<String, Family>, String> {
    let mut fams: BTreeMap<String, Family> = BTreeMap::new();
    for line in text.lines() {
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            fams.entry(name.to_string()).or_default().help = help.to_string();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest
                .split_once(' ')
                .ok_or_else(|| format!("bad TYPE line {line}"))?;
            if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind) {
                return Err(format!("unknown type in {line}"));
            }
            let f = fams.entry(name.to_string()).or_default();
            if !f.kind.is_empty() {
                return Err(format!("{name} typed twice"));
            }
            f.kind = kind.to_string();
        } else if line.starts_with('#') {
            continue;
        } else {
            let (name_labels, value) = match line.find('}') {
                Some(i) => (&line[..=i], line[i + 1..].trim()),
                None => line
                    .split_once(' ')
                    .ok_or_else(|| format!("no value: {line}"))?,
            };
            let value = value.split(' ').next().unwrap_or("");
            let (name, labels) = match name_labels.split_once('{') {
                Some((n, l)) => (n, parse_labels(l.strip_suffix('}').unwrap_or(l))?),
                None => (name_labels, BTreeMap::new()),
            };
            let fam = family_of(name, &fams)
                .ok_or_else(|| format!("sample of an undeclared family: {line}"))?
                .to_string();
            let v = parse_value(value)?;
            fams.get_mut(&fam)
                .unwrap()
                .samples
                .push((name.to_string(), labels, v));
        }
    }
    for (name, f) in &fams {
        if f.kind.is_empty() {
            return Err(format!("{name} has HELP but no TYPE"));
        }
        if f.kind == "histogram" {
            check_histogram(name, f)?;
        }
    }
    Ok(fams)
}

/// One histogram series: (le, cumulative count) buckets, `_count`, whether `_sum` was seen.
type Series = (Vec<(f64, f64)>, Option<f64>, bool);

/// Per label set: `le` ascending, counts cumulative, `+Inf` equal to `_count`, a `_sum`.
fn check_histogram(name: &str, f: &Family) -> Result<(), String> {
    let mut series: BTreeMap<Vec<(String, String)>, Series> = BTreeMap::new();
    for (sample, labels, v) in &f.samples {
        let mut key: Vec<(String, String)> = labels
            .iter()
            .filter(|(k, _)| k.as_str() != "le")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        key.sort();
        let e = series.entry(key).or_default();
        if sample.ends_with("_bucket") {
            let le = parse_value(labels.get("le").ok_or("bucket without le")?)?;
            e.0.push((le, *v));
        } else if sample.ends_with("_count") {
            e.1 = Some(*v);
        } else if sample.ends_with("_sum") {
            e.2 = true;
        }
    }
    for (key, (buckets, count, sum)) in series {
        let ctx = format!("{name}{key:?}");
        if !sum || count.is_none() || buckets.is_empty() {
            return Err(format!("{ctx}: incomplete histogram"));
        }
        for w in buckets.windows(2) {
            if w[1].0 <= w[0].0 || w[1].1 < w[0].1 {
                return Err(format!("{ctx}: buckets not ascending/cumulative"));
            }
        }
        let last = buckets.last().unwrap();
        if !last.0.is_infinite() || Some(last.1) != count {
            return Err(format!("{ctx}: +Inf bucket differs from _count"));
        }
    }
    Ok(())
}

/// The sum over a family's samples named `sample` whose labels include `with`.
fn total(
    fams: &BTreeMap<String, Family>,
    family: &str,
    sample: &str,
    with: &[(&str, &str)],
) -> f64 {
    fams.get(family)
        .map(|f| {
            f.samples
                .iter()
                .filter(|(n, l, _)| {
                    n == sample
                        && with
                            .iter()
                            .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
                })
                .map(|(_, _, v)| v)
                .sum()
        })
        .unwrap_or(0.0)
}

#[test]
fn parser_is_strict() {
    let good = "# HELP a_total [ALPHA] x\n# TYPE a_total counter\na_total{code=\"200\",host=\"h:1\"} 3\n\
                # TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 3.5\nh_count 2\n";
    let f = parse_exposition(good).unwrap();
    assert_eq!(f["a_total"].kind, "counter");
    assert_eq!(total(&f, "a_total", "a_total", &[("code", "200")]), 3.0);
    for bad in [
        "b 1\n",                        // undeclared
        "# TYPE a counter\na{x=1} 1\n", // unquoted label
        "# TYPE a counter\na 1x\n",     // bad value
        "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n", // not cumulative
        "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 3\n", // +Inf != count
    ] {
        assert!(parse_exposition(bad).is_err(), "accepted: {bad}");
    }
}

// ---- the node ----

/// One scrape: body, HTTP code, seconds, bytes (curl's own figures).
fn scrape(rig: &Rig, url: &str) -> (String, String, f64, u64) {
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net={}", rig.netns_path()))
        .args([
            "curl",
            "-sk",
            "--max-time",
            "10",
            "-w",
            "\n%{http_code} %{time_total} %{size_download}",
            url,
        ])
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, tail) = text.rsplit_once('\n').unwrap_or((&text, ""));
    let mut it = tail.split(' ');
    let code = it.next().unwrap_or("").to_string();
    let secs = it.next().and_then(|s| s.parse().ok()).unwrap_or(0.0);
    let bytes = it.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    (body.to_string(), code, secs, bytes)
}

fn scrape_parsed(rig: &Rig, url: &str) -> BTreeMap<String, Family> {
    let (body, code, secs, bytes) = scrape(rig, url);
    assert_eq!(code, "200", "{url}: {body}");
    eprintln!("scrape {url}: {bytes} bytes in {:.1} ms", secs * 1000.0);
    parse_exposition(&body).unwrap_or_else(|e| panic!("{url}: {e}\n{body}"))
}

fn up(
    name: &str,
) -> (
    Rig,
    NetnsControlPlane,
    node_tests::joined::JoinedNode,
    Kubelet,
) {
    node_tests::joined::up(name, Options::default(), true)
}

#[test]
fn both_endpoints_serve_every_family_after_a_pod_start_and_a_proxy_sync() {
    require_rig!();
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (rig, cp, _node, kubelet) = up("e2e-metrics");

    cp.create(
        "pods",
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "scraped", "namespace": "default"},
               "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 1,
                        "containers": [{"name": "main", "image": BUSYBOX,
                                        "command": ["sh", "-c", "sleep 3600"]}]}}),
    )
    .unwrap();
    let pod: Value = wait_for("pod Running", Duration::from_secs(60), || {
        cp.get("pods", "default", "scraped")
            .filter(|p| p["status"]["phase"] == "Running")
    });
    let pod_ip = pod["status"]["podIP"].as_str().unwrap().to_string();

    // A Service whose slice carries the endpoints controller's trigger time: the proxy's
    // network programming latency is measured from it to the rules being in the kernel.
    cp.create(
        "services",
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"namespace": "default", "name": "scraped"},
               "spec": {"clusterIP": "10.96.8.8", "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}}),
    )
    .unwrap();
    let trigger = jiff::Timestamp::now().to_string();
    cp.create(
        "endpointslices.discovery.k8s.io",
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"namespace": "default", "name": "scraped-1",
                            "labels": {"kubernetes.io/service-name": "scraped"},
                            "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": trigger}},
               "addressType": "IPv4",
               "endpoints": [{"addresses": [pod_ip.clone()], "conditions": {"ready": true}, "nodeName": NODE}],
               "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}),
    )
    .unwrap();
    wait_for(
        "the proxy to program default/scraped",
        Duration::from_secs(30),
        || {
            let out = rig.sh("(iptables-nft-save -t nat; iptables-legacy-save -t nat) 2>/dev/null");
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            text.contains(&format!("--to-destination {pod_ip}:8080"))
                .then_some(())
        },
    );

    // kube-proxy's /metrics (the hosted role's :10249).
    let proxy = wait_for(
        "network programming observed",
        Duration::from_secs(15),
        || {
            let f = scrape_parsed(&rig, "http://127.0.0.1:10249/metrics");
            (total(
                &f,
                "kubeproxy_network_programming_duration_seconds",
                "kubeproxy_network_programming_duration_seconds_count",
                &[],
            ) >= 1.0)
                .then_some(f)
        },
    );
    for (name, kind) in [
        ("kubeproxy_sync_proxy_rules_duration_seconds", "histogram"),
        (
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "histogram",
        ),
        (
            "kubeproxy_network_programming_duration_seconds",
            "histogram",
        ),
        ("kubeproxy_sync_proxy_rules_last_timestamp_seconds", "gauge"),
    ] {
        assert_eq!(
            proxy.get(name).map(|f| f.kind.as_str()),
            Some(kind),
            "{name}"
        );
    }
    assert!(
        total(
            &proxy,
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "kubeproxy_sync_proxy_rules_duration_seconds_count",
            &[]
        ) >= 1.0
    );
    assert!(
        proxy["kubeproxy_network_programming_duration_seconds"]
            .help
            .starts_with("[ALPHA] ")
    );
    assert_common(&proxy, "kube-proxy");

    // The kubelet's /metrics.
    let k = scrape_parsed(&rig, "https://127.0.0.1:10250/metrics");
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
        ("volume_manager_total_volumes", "gauge"),
        ("storage_operation_duration_seconds", "histogram"),
        ("storage_operation_errors_total", "counter"),
        ("kubelet_http_requests_total", "counter"),
        ("kubelet_http_requests_duration_seconds", "histogram"),
        ("kubelet_http_inflight_requests", "gauge"),
        ("kubelet_server_open_connections", "gauge"),
        ("kubelet_server_rejected_connections_total", "counter"),
        ("kubelet_server_tls_handshake_errors_total", "counter"),
    ] {
        assert_eq!(k.get(name).map(|f| f.kind.as_str()), Some(kind), "{name}");
    }
    assert!(k["kubelet_running_pods"].help.starts_with("[ALPHA] "));
    assert_eq!(
        total(
            &k,
            "kubelet_node_name",
            "kubelet_node_name",
            &[("node", NODE)]
        ),
        1.0
    );
    let moved = |family: &str, sample: &str, with: &[(&str, &str)]| {
        let v = total(&k, family, sample, with);
        assert!(v >= 1.0, "{sample}{with:?} did not move: {v}");
    };
    moved(
        "kubelet_runtime_operations_total",
        "kubelet_runtime_operations_total",
        &[("operation_type", "run_podsandbox")],
    );
    moved(
        "kubelet_runtime_operations_total",
        "kubelet_runtime_operations_total",
        &[("operation_type", "list_containers")],
    );
    moved(
        "kubelet_runtime_operations_duration_seconds",
        "kubelet_runtime_operations_duration_seconds_count",
        &[("operation_type", "start_container")],
    );
    moved(
        "kubelet_pod_start_duration_seconds",
        "kubelet_pod_start_duration_seconds_count",
        &[],
    );
    moved(
        "kubelet_pod_worker_duration_seconds",
        "kubelet_pod_worker_duration_seconds_count",
        &[("operation_type", "create")],
    );
    moved(
        "kubelet_pleg_relist_duration_seconds",
        "kubelet_pleg_relist_duration_seconds_count",
        &[],
    );
    moved(
        "kubelet_pleg_relist_interval_seconds",
        "kubelet_pleg_relist_interval_seconds_count",
        &[],
    );
    moved(
        "kubelet_started_pods_total",
        "kubelet_started_pods_total",
        &[],
    );
    moved(
        "kubelet_started_containers_total",
        "kubelet_started_containers_total",
        &[("container_type", "container")],
    );
    moved("kubelet_running_pods", "kubelet_running_pods", &[]);
    moved(
        "kubelet_running_containers",
        "kubelet_running_containers",
        &[("container_state", "running")],
    );
    moved(
        "kubelet_cgroup_manager_duration_seconds",
        "kubelet_cgroup_manager_duration_seconds_count",
        &[("operation_type", "create")],
    );
    moved(
        "kubelet_node_startup_duration_seconds",
        "kubelet_node_startup_duration_seconds",
        &[],
    );
    let last_seen = total(
        &k,
        "kubelet_pleg_last_seen_seconds",
        "kubelet_pleg_last_seen_seconds",
        &[],
    );
    let now = jiff::Timestamp::now().as_second() as f64;
    assert!(
        (now - last_seen).abs() < 30.0,
        "PLEG last seen {last_seen}, now {now}"
    );
    // Requests to the apiserver, by the host:port of its URL.
    let host = k["rest_client_requests_total"]
        .samples
        .iter()
        .find(|(_, l, _)| l.get("code").is_some_and(|c| c == "201") && l["method"] == "POST")
        .map(|(_, l, _)| l["host"].clone())
        .unwrap_or_else(|| panic!("no POST 201: {:?}", k["rest_client_requests_total"]));
    assert!(host.contains(':'), "{host}");
    moved(
        "rest_client_request_duration_seconds",
        "rest_client_request_duration_seconds_count",
        &[("verb", "GET"), ("host", &host)],
    );
    assert_common(&k, "kubelet");
    drop(kubelet);
}

/// process_*, rest_client_* and the task gauge, on either endpoint.
fn assert_common(f: &BTreeMap<String, Family>, who: &str) {
    for (name, kind) in [
        ("process_cpu_seconds_total", "counter"),
        ("process_resident_memory_bytes", "gauge"),
        ("process_virtual_memory_bytes", "gauge"),
        ("process_open_fds", "gauge"),
        ("process_max_fds", "gauge"),
        ("process_start_time_seconds", "gauge"),
        ("rest_client_requests_total", "counter"),
        ("rest_client_request_duration_seconds", "histogram"),
        ("tokio_alive_tasks", "gauge"),
    ] {
        assert_eq!(
            f.get(name).map(|x| x.kind.as_str()),
            Some(kind),
            "{who}: {name}"
        );
    }
    assert!(
        total(
            f,
            "process_resident_memory_bytes",
            "process_resident_memory_bytes",
            &[]
        ) > 1e6
    );
    assert!(total(f, "tokio_alive_tasks", "tokio_alive_tasks", &[]) >= 1.0);
    assert!(
        total(
            f,
            "rest_client_requests_total",
            "rest_client_requests_total",
            &[]
        ) >= 1.0,
        "{who}"
    );
}

/// notAfter of the first certificate in a PEM file, unix seconds.
fn not_after(path: &Path) -> i64 {
    let pem = std::fs::read(path).unwrap();
    let (_, p) = x509_parser::pem::parse_x509_pem(&pem).unwrap();
    p.parse_x509().unwrap().validity().not_after.timestamp()
}

#[test]
fn client_certificate_ttl_is_within_the_bootstrapped_certificates_remaining_lifetime() {
    require_rig!();
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (rig, _cp, node, kubelet) = up("e2e-metrics-cert");
    let current = node.p("var/lib/kubelet/pki/kubelet-client-current.pem");
    wait_for("kubelet.conf written", Duration::from_secs(30), || {
        current.exists().then_some(())
    });
    let expires = not_after(&current);
    let before = Instant::now();
    let now_before = jiff::Timestamp::now().as_second();
    let k = scrape_parsed(&rig, "https://127.0.0.1:10250/metrics");
    let now_after = jiff::Timestamp::now().as_second() + 1;
    let ttl = total(
        &k,
        "kubelet_certificate_manager_client_ttl_seconds",
        "kubelet_certificate_manager_client_ttl_seconds",
        &[],
    );
    assert!(ttl.is_finite(), "client TTL is {ttl} after bootstrap");
    assert!(
        ttl <= (expires - now_before) as f64 + 1.0 && ttl >= (expires - now_after) as f64 - 1.0,
        "TTL {ttl} outside [{}, {}] (scrape took {:?})",
        expires - now_after,
        expires - now_before,
        before.elapsed()
    );
    // The serving certificate (self-signed here) has one too.
    let server_ttl = total(
        &k,
        "kubelet_certificate_manager_server_ttl_seconds",
        "kubelet_certificate_manager_server_ttl_seconds",
        &[],
    );
    assert!(server_ttl.is_finite() && server_ttl > 0.0, "{server_ttl}");
    assert_eq!(
        total(
            &k,
            "kubelet_certificate_manager_client_expiration_renew_errors",
            "kubelet_certificate_manager_client_expiration_renew_errors",
            &[]
        ),
        0.0
    );
    drop(kubelet);
}
