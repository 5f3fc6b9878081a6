//! The kubelet's :10250 behind kubeadm's settings (anonymous off, x509 against the cluster CA,
//! TokenReview, Webhook authorization): who gets which status code, asked of the real agent
//! joined to the test control plane, and what the answer caches save.

use node_tests::controlplane::Options;
use node_tests::require_rig;
use node_tests::{NetnsControlPlane, Rig};
use std::path::Path;
use std::time::Duration;

/// Rigs are heavy (containerd each) and this machine has two cores: one test at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `curl` inside the rig's netns: (status code, body, seconds).
fn curl(rig: &Rig, path: &str, extra: &[&str]) -> (u16, String, f64) {
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net={}", rig.netns_path()))
        .args([
            "curl",
            "-sk",
            "--max-time",
            "10",
            "-w",
            "\n%{http_code} %{time_total}",
        ])
        .args(extra)
        .arg(format!("https://127.0.0.1:10250{path}"))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, tail) = text.rsplit_once('\n').unwrap_or((&text, ""));
    let mut it = tail.split(' ');
    let code = it.next().and_then(|c| c.parse().ok()).unwrap_or(0);
    let secs = it.next().and_then(|s| s.parse().ok()).unwrap_or(0.0);
    (code, body.to_string(), secs)
}

/// One curl run over one kept-alive connection: each (header, path) in turn; per request
/// (status code, seconds from the request's start to its end, no handshake after the first).
fn curl_many(rig: &Rig, reqs: &[(String, &str)]) -> Vec<(u16, f64)> {
    let mut cmd = std::process::Command::new("nsenter");
    cmd.arg(format!("--net={}", rig.netns_path()))
        .args(["curl", "--max-time", "60"]);
    for (i, (h, path)) in reqs.iter().enumerate() {
        if i > 0 {
            cmd.arg("--next");
        }
        cmd.args([
            "-sk",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %{time_total} %{time_pretransfer}\n",
            "-H",
        ])
        .arg(h)
        .arg(format!("https://127.0.0.1:10250{path}"));
    }
    let out = cmd.output().expect("curl");
    if !out.status.success() {
        eprintln!(
            "curl: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let num = |i: usize| f.get(i).and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0);
            (num(0) as u16, num(1) - num(2))
        })
        .collect()
}

fn write_pair(
    dir: &Path,
    name: &str,
    cert: &node_tests::controlplane::pki::IssuedCert,
) -> [String; 4] {
    let c = dir.join(format!("{name}.crt"));
    let k = dir.join(format!("{name}.key"));
    std::fs::write(&c, &cert.cert_pem).unwrap();
    std::fs::write(&k, &cert.key_pem).unwrap();
    [
        "--cert".into(),
        c.display().to_string(),
        "--key".into(),
        k.display().to_string(),
    ]
}

fn args(a: &[String]) -> Vec<&str> {
    a.iter().map(String::as_str).collect()
}

fn reviews(cp: &NetnsControlPlane, what: &str) -> usize {
    cp.requests()
        .iter()
        .filter(|r| r.path.ends_with(what))
        .count()
}

#[test]
fn authn_authz_table_against_the_joined_agent() {
    require_rig!();
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (rig, cp, node, kubelet) = node_tests::joined::up("e2e-authz", Options::default(), false);
    let dir = node.p("clients");
    std::fs::create_dir_all(&dir).unwrap();

    // Callers: a reader token granted pods, metrics and stats; a certificate of the cluster CA
    // without rights; an admin certificate (group system:masters, granted everything); the
    // same admin name from another CA.
    cp.add_token("reader-token", "reader", &[]);
    for sub in ["pods", "metrics", "stats"] {
        cp.grant("reader", "get", sub);
    }
    cp.grant("system:masters", "*", "*");
    let nobody = cp
        .issue_client_cert("nobody", &[], Duration::from_secs(3600))
        .unwrap();
    let nobody = write_pair(&dir, "nobody", &nobody);
    let admin = cp
        .issue_client_cert("admin", &["system:masters"], Duration::from_secs(3600))
        .unwrap();
    let admin = write_pair(&dir, "admin", &admin);
    let stranger = node_tests::controlplane::pki::Authority::new("another-ca")
        .unwrap()
        .client_cert("admin", &["system:masters"], Duration::from_secs(3600))
        .unwrap();
    let stranger = write_pair(&dir, "stranger", &stranger);
    let reader = [
        "-H".to_string(),
        "Authorization: Bearer reader-token".to_string(),
    ];
    let wrong = ["-H".to_string(), "Authorization: Bearer nope".to_string()];

    let none: [String; 0] = [];
    let cases: Vec<(&str, &[String], &str, u16)> = vec![
        ("no credentials", &none, "/pods", 401),
        ("unknown token", &wrong, "/pods", 401),
        ("client cert of another CA", &stranger, "/pods", 401),
        ("cluster cert without rights", &nobody, "/pods", 403),
        ("reader token", &reader, "/pods", 200),
        ("reader token", &reader, "/metrics", 200),
        ("reader token", &reader, "/configz", 403),
        ("reader token", &reader, "/healthz", 403),
        ("reader token", &reader, "/logs/", 403),
        ("admin cert", &admin, "/configz", 200),
        ("admin cert", &admin, "/healthz", 200),
    ];
    for (who, creds, path, want) in &cases {
        let (code, body, _) = curl(&rig, path, &args(creds));
        assert_eq!(
            code,
            *want,
            "{who} GET {path}: {body}\n{}",
            kubelet.log_text()
        );
    }
    // Issue 24: a refused request ends its connection, so a second request on the same curl
    // run needs a connection of its own; an allowed one keeps it. HTTP/1.1 here: with HTTP/2
    // curl may send the second request before the GOAWAY reaches it, and the server then
    // answers it on the closing connection (a race, not a leak; the HTTP/2 GOAWAY path has
    // no test of its own yet).
    let reuse = |h: &str| -> Vec<String> {
        let mut cmd = std::process::Command::new("nsenter");
        cmd.arg(format!("--net={}", rig.netns_path())).args([
            "curl",
            "--http1.1",
            "--max-time",
            "20",
        ]);
        for i in 0..2 {
            if i > 0 {
                cmd.arg("--next");
            }
            cmd.args([
                "-sk",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code} %{num_connects}\n",
                "-H",
                h,
                "https://127.0.0.1:10250/pods",
            ]);
        }
        let out = cmd.output().expect("curl");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    };
    assert_eq!(
        reuse("Authorization: Bearer nope"),
        ["401 1", "401 1"],
        "a 401 closes its connection"
    );
    assert_eq!(
        reuse("Authorization: Bearer reader-token"),
        ["200 1", "200 0"],
        "an allowed request keeps it"
    );
    let (code, body, _) = curl(&rig, "/pods", &args(&nobody));
    assert_eq!(
        body.trim(),
        "Forbidden (user=nobody, verb=get, resource=nodes, subresource(s)=[pods proxy])"
    );
    assert_eq!(code, 403);
    // stats is granted: authorization lets the request through (200, or 404 while the
    // route is not served), never 401/403.
    let (code, body, _) = curl(&rig, "/stats/summary", &args(&reader));
    assert!(code == 200 || code == 404, "/stats/summary: {code} {body}");
    // exec is `create` on nodes/proxy: the reader holds no such grant.
    let (code, body, _) = curl(
        &rig,
        "/exec/default/p/c?command=id",
        &[&["-X", "POST"][..], &args(&reader)].concat(),
    );
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("verb=create"), "{body}");

    // The caches: repeated requests ask the apiserver nothing more. Figures over one
    // kept-alive connection, so the TLS handshake is not part of them.
    let reader_h = "Authorization: Bearer reader-token".to_string();
    let warm: Vec<(String, &str)> = (0..50).map(|_| (reader_h.clone(), "/pods")).collect();
    curl_many(&rig, &warm[..1]);
    let (tr0, sar0) = (
        reviews(&cp, "/tokenreviews"),
        reviews(&cp, "/subjectaccessreviews"),
    );
    let cached = curl_many(&rig, &warm);
    let (tr1, sar1) = (
        reviews(&cp, "/tokenreviews"),
        reviews(&cp, "/subjectaccessreviews"),
    );
    assert_eq!(cached.len(), 50);
    assert!(cached.iter().all(|(c, _)| *c == 200), "{cached:?}");
    assert_eq!(
        (tr1 - tr0, sar1 - sar0),
        (0, 0),
        "cached answers must not be asked again"
    );
    // Uncached: a new token of a new user each time (one TokenReview + one
    // SubjectAccessReview; decisions are cached per user and attributes, not per token).
    let fresh_reqs: Vec<(String, &str)> = (0..50)
        .map(|i| {
            let tok = format!("fresh-{i}");
            cp.add_token(&tok, &tok, &[]);
            cp.grant(&tok, "get", "pods");
            (format!("Authorization: Bearer {tok}"), "/pods")
        })
        .collect();
    let fresh = curl_many(&rig, &fresh_reqs);
    assert!(fresh.iter().all(|(c, _)| *c == 200), "{fresh:?}");
    assert_eq!(reviews(&cp, "/tokenreviews") - tr1, 50);
    assert_eq!(reviews(&cp, "/subjectaccessreviews") - sar1, 50);
    let med = |v: &[(u16, f64)]| {
        let mut t: Vec<f64> = v.iter().skip(1).map(|(_, s)| *s * 1000.0).collect();
        t.sort_by(|a, b| a.total_cmp(b));
        (t[t.len() / 2], t[t.len() * 9 / 10])
    };
    let ((c50, c90), (f50, f90)) = (med(&cached), med(&fresh));
    eprintln!(
        "authz figures (GET /pods, kept-alive connection): cache hit rate 50/50 (0 TokenReviews, 0 SubjectAccessReviews); cached p50 {c50:.2} ms p90 {c90:.2} ms; uncached (1 TokenReview + 1 SubjectAccessReview) p50 {f50:.2} ms p90 {f90:.2} ms; cached/uncached p50 ratio {:.2}",
        c50 / f50
    );

    // The apiserver goes away: what was decided stays decided for its TTL, a fresh decision
    // is refused (500: no answer), a fresh token is a 401; nothing new is allowed.
    cp.stop();
    let (code, _, _) = curl(&rig, "/pods", &args(&reader));
    assert_eq!(code, 200, "cached identity and decision");
    let (code, body, _) = curl(&rig, "/configz", &args(&nobody));
    assert_eq!(code, 500, "fresh decision without an apiserver: {body}");
    assert!(
        body.starts_with("Authorization error (user=nobody"),
        "{body}"
    );
    cp.add_token("late-token", "reader", &[]);
    let (code, _, _) = curl(&rig, "/pods", &["-H", "Authorization: Bearer late-token"]);
    assert_eq!(code, 401, "a token that cannot be reviewed");
    let (code, _, _) = curl(&rig, "/pods", &[]);
    assert_eq!(code, 401);
    drop(kubelet);
}

/// Issue 24: a certificate signed by the cluster (client) CA whose subject has no CommonName
/// names no user: 401 from :10250 under kubeadm's settings, even when its O claims
/// `system:masters` (which the control plane grants everything).
#[test]
fn a_client_certificate_without_a_common_name_is_401() {
    require_rig!();
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (rig, cp, node, kubelet) = node_tests::joined::up("e2e-nocn", Options::default(), false);
    let dir = node.p("clients");
    std::fs::create_dir_all(&dir).unwrap();
    cp.grant("system:masters", "*", "*");
    let issue = |cn: &str| {
        cp.issue_client_cert(cn, &["system:masters"], Duration::from_secs(3600))
            .unwrap()
    };
    let admin = write_pair(&dir, "admin", &issue("admin"));
    let no_cn = write_pair(&dir, "no-cn", &issue(""));
    // The same CA and group with a name: let in, so the CA and the grant work.
    let (code, body, _) = curl(&rig, "/configz", &args(&admin));
    assert_eq!(code, 200, "{body}");
    for path in ["/configz", "/pods", "/runningpods/"] {
        let (code, body, _) = curl(&rig, path, &args(&no_cn));
        assert_eq!(
            (code, body.trim()),
            (401, "Unauthorized"),
            "no-CN certificate GET {path}\n{}",
            kubelet.log_text()
        );
    }
    drop(kubelet);
}

/// `curl` inside the rig's netns against the control plane: (status code, body).
fn curl_api(rig: &Rig, cp: &NetnsControlPlane, path: &str, extra: &[&str]) -> (u16, String) {
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net={}", rig.netns_path()))
        .args(["curl", "-sk", "--max-time", "50", "-w", "\n%{http_code}"])
        .args(extra)
        .arg(format!("{}{path}", cp.url()))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or((&text, ""));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// Removes a file the test put under the node's real `/var/log`.
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Issue 30: `kubectl get --raw /api/v1/nodes/N/proxy/...` reaches the joined agent through the
/// control plane's `nodes/proxy` (its kubelet client certificate, Webhook authz on :10250).
/// NodeLogQuery (`enableSystemLogQuery` + the gate) answers `?query=<service>`: the rig node
/// has no journald unit of that name, so the answer is the file fallback `/var/log/<svc>.log`
/// (a file this test writes on the host's /var/log and removes). PUT `/debug/flags/v` changes
/// the agent's verbosity (its answer and its log say so); a bad level is refused with 400 and
/// a hostile query with upstream's validation, both through the proxy.
#[test]
fn node_proxy_log_query_and_verbosity_through_the_control_plane() {
    require_rig!();
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (rig, cp, node, kubelet) = node_tests::joined::up_configured(
        "e2e-nproxy",
        Options::default(),
        false,
        &[],
        // JSON lines carry the verbosity (`v`) a debug line is told by.
        "enableSystemLogQuery: true\nfeatureGates:\n  NodeLogQuery: true\nlogging:\n  format: json\n",
    );
    let dir = node.p("clients");
    std::fs::create_dir_all(&dir).unwrap();
    // kubeadm binds its `kubeadm:cluster-admins` group (the apiserver-kubelet-client's O) to
    // cluster-admin.
    cp.grant(
        node_tests::controlplane::node_proxy::KUBELET_CLIENT_GROUP,
        "*",
        "*",
    );
    let admin = write_pair(
        &dir,
        "admin",
        &cp.issue_client_cert("admin", &["system:masters"], Duration::from_secs(3600))
            .unwrap(),
    );
    let nproxy = format!("/api/v1/nodes/{}/proxy", node_tests::joined::NODE);
    node_tests::util::wait_for(
        "the Node with its kubelet endpoint",
        Duration::from_secs(60),
        || {
            cp.get("nodes", "", node_tests::joined::NODE)
                .filter(|n| {
                    n.pointer("/status/daemonEndpoints/kubeletEndpoint/Port")
                        .is_some()
                })
                .map(|_| ())
        },
    );

    // The log query, answered from the file fallback.
    let svc = format!("e2e-nproxy-{}", std::process::id());
    let file = RemoveOnDrop(std::path::PathBuf::from(format!("/var/log/{svc}.log")));
    let marker = format!("marker line of {svc}");
    std::fs::write(&file.0, format!("{marker}\n")).unwrap();
    let (code, body) = curl_api(
        &rig,
        &cp,
        &format!("{nproxy}/logs/?query={svc}"),
        &args(&admin),
    );
    assert_eq!(code, 200, "{body}\n{}", kubelet.log_text());
    assert!(body.contains(&marker), "{body}");
    // Upstream's validation, through the proxy: a space in a service name, a negative tail.
    let (code, body) = curl_api(
        &rig,
        &cp,
        &format!("{nproxy}/logs/?query=a%20b&tailLines=-3"),
        &args(&admin),
    );
    assert!(matches!(code, 400 | 406), "{code} {body}");
    // Without the proxy's rights the control plane refuses before the kubelet is asked.
    cp.add_token(
        "bootstrap-ish",
        "system:bootstrap:abcdef",
        &["system:bootstrappers"],
    );
    let (code, body) = curl_api(
        &rig,
        &cp,
        &format!("{nproxy}/logs/?query={svc}"),
        &["-H", "Authorization: Bearer bootstrap-ish"],
    );
    assert_eq!(code, 403, "{body}");
    assert!(!body.contains(&marker), "{body}");

    // The verbosity, set at run time.
    let flags = format!("{nproxy}/debug/flags/v");
    let (code, body) = curl_api(
        &rig,
        &cp,
        &flags,
        &[&args(&admin)[..], &["-X", "PUT", "--data-binary", "x"]].concat(),
    );
    assert_eq!(code, 400, "{body}");
    assert!(
        body.contains("failed set klog.logging.verbosity x"),
        "{body}"
    );
    let (code, body) = curl_api(
        &rig,
        &cp,
        &flags,
        &[&args(&admin)[..], &["-X", "PUT", "--data-binary", "4"]].concat(),
    );
    assert_eq!(code, 200, "{body}\n{}", kubelet.log_text());
    assert_eq!(body.trim(), "successfully set klog.logging.verbosity to 4");
    node_tests::util::wait_for(
        "the log line of the change",
        Duration::from_secs(10),
        || {
            kubelet
                .log_text()
                .lines()
                .any(|l| {
                    l.contains("log verbosity changed through /debug/flags/v") && l.contains('4')
                })
                .then_some(())
        },
    );
    // Debug lines, absent at verbosity 0, follow the change.
    let debug = |l: &str| l.contains("\"v\":2");
    let before = kubelet.log_text();
    let at = before
        .lines()
        .position(|l| l.contains("log verbosity changed through /debug/flags/v"))
        .unwrap();
    assert!(
        !before.lines().take(at).any(debug),
        "debug lines before the change"
    );
    node_tests::util::wait_for("a debug line", Duration::from_secs(20), || {
        kubelet.log_text().lines().skip(at).any(debug).then_some(())
    });
    let (code, body) = curl_api(&rig, &cp, &flags, &args(&admin));
    assert_eq!((code, body.trim()), (406, "unsupported http method"));
    drop(kubelet);
}
