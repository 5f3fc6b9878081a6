//! Cluster pods on real containerd using what the kubelet reads from the apiserver besides
//! pods: an imagePullSecret pulling from an authenticated registry (served by the test,
//! inside the rig's netns, basic auth), the same image without the secret failing with
//! ErrImagePull, a RuntimeClass resolving to the rig's runc handler and an unknown one
//! failing the sandbox, and service-link variables with and without `enableServiceLinks`.
//! Pulled-image credential verification: once the private image is on the node, a pod
//! without the secret must pull it itself (and is refused) or, with `Never`, fails as if it
//! were absent; the record of the pull names the secret.

use base64::Engine;
use node_tests::controlplane::Options;
use node_tests::joined::{JoinedNode, NODE, NODE_IP};
use node_tests::registry;
use node_tests::require_rig;
use node_tests::{Kubelet, NetnsControlPlane, Rig, wait_for};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

const BUSYBOX: &str = "docker.io/library/busybox:1.35";
const REGISTRY: &str = "127.0.0.1:5000";
const PRIVATE: &str = "127.0.0.1:5000/private/busybox:1.35";
const USER: &str = "puller";
const PASSWORD: &str = "s3cret-pw";

fn pod_until(
    cp: &NetnsControlPlane,
    kubelet: &mut Kubelet,
    name: &str,
    what: &str,
    ok: impl Fn(&Value) -> bool,
) -> Value {
    wait_for(
        &format!("pod {name}: {what}"),
        Duration::from_secs(60),
        || {
            if let Some(st) = kubelet.exited() {
                panic!("kubelet exited: {st}\n{}", kubelet.log_text());
            }
            cp.get("pods", "default", name).filter(|p| ok(p))
        },
    )
}

fn waiting_reason(p: &Value) -> String {
    p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

fn has_event(cp: &NetnsControlPlane, reason: &str, needle: &str) -> bool {
    cp.list("events", Some("default"))
        .iter()
        .any(|e| e["reason"] == reason && e["message"].as_str().unwrap_or("").contains(needle))
}

/// Serves the rig's busybox image as `private/busybox:1.35` on 127.0.0.1:5000 inside the
/// rig's netns, with basic auth, and points containerd at it over plain HTTP.
fn start_registry(rig: &Rig, cp: &NetnsControlPlane) -> Arc<registry::Stats> {
    let layout = tempfile_dir("registry-layout");
    let tar = std::path::Path::new(rig.get("RIG_IMAGES")).join("busybox.tar");
    let out = std::process::Command::new("timeout")
        .args(["60", "tar", "-xf"])
        .arg(&tar)
        .arg("-C")
        .arg(&layout)
        .output()
        .expect("run tar");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut content = registry::Content::default();
    content
        .add_layout(&layout, "private/busybox", "1.35")
        .expect("busybox layout");
    let _ = std::fs::remove_dir_all(&layout);
    let stats = Arc::new(registry::Stats::default());
    let s = stats.clone();
    cp.run(move |_| async move {
        let listener = tokio::net::TcpListener::bind(REGISTRY)
            .await
            .expect("bind registry");
        tokio::spawn(registry::serve(
            listener,
            content,
            Some((USER.into(), PASSWORD.into())),
            s,
        ));
    });
    let hosts = std::path::Path::new(rig.get("RIG_STATE"))
        .join("certs.d")
        .join(REGISTRY);
    std::fs::create_dir_all(&hosts).unwrap();
    std::fs::write(
        hosts.join("hosts.toml"),
        format!(
            "server = \"http://{REGISTRY}\"\n\n[host.\"http://{REGISTRY}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
        ),
    )
    .unwrap();
    stats
}

/// Serves the rig's busybox image as each of `repos` (tag `1`) without auth on `addr` inside
/// the rig's netns, holding every manifest request `delay_ms`, and points containerd at it
/// over plain HTTP.
fn start_open_registry(
    rig: &Rig,
    cp: &NetnsControlPlane,
    addr: &'static str,
    repos: &[&str],
    delay_ms: u64,
) -> Arc<registry::Stats> {
    let layout = tempfile_dir(&format!(
        "registry-open-{}",
        repos.join("-").replace('/', "_")
    ));
    let tar = std::path::Path::new(rig.get("RIG_IMAGES")).join("busybox.tar");
    let out = std::process::Command::new("timeout")
        .args(["60", "tar", "-xf"])
        .arg(&tar)
        .arg("-C")
        .arg(&layout)
        .output()
        .expect("run tar");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut content = registry::Content::default();
    for repo in repos {
        content
            .add_layout(&layout, repo, "1")
            .expect("busybox layout");
    }
    let _ = std::fs::remove_dir_all(&layout);
    let stats = Arc::new(registry::Stats::default());
    stats.manifest_delay_ms.store(delay_ms, Ordering::SeqCst);
    let s = stats.clone();
    cp.run(move |_| async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .expect("bind registry");
        tokio::spawn(registry::serve(listener, content, None, s));
    });
    let hosts = std::path::Path::new(rig.get("RIG_STATE"))
        .join("certs.d")
        .join(addr);
    std::fs::create_dir_all(&hosts).unwrap();
    std::fs::write(
        hosts.join("hosts.toml"),
        format!(
            "server = \"http://{addr}\"\n\n[host.\"http://{addr}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
        ),
    )
    .unwrap();
    stats
}

fn tempfile_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn pull_secrets_runtime_classes_and_service_links() {
    require_rig!();
    let rig = Rig::up("e2e-images");
    let out = rig.sh(&format!("ip addr add {NODE_IP}/32 dev lo"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cp = NetnsControlPlane::start(&rig, Options::default());
    let stats = start_registry(&rig, &cp);
    let node = JoinedNode::write(&cp, &rig);
    let mut kubelet = Kubelet::builder(&rig)
        .args(node.command_line())
        .log(node.p("kubelet.log"))
        .start();
    wait_for("node registered", Duration::from_secs(60), || {
        if let Some(st) = kubelet.exited() {
            panic!("kubelet exited: {st}\n{}", kubelet.log_text());
        }
        cp.get("nodes", "", NODE)
    });

    // What the pods read: a pull secret, Services, RuntimeClasses.
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
    let docker_config = json!({"auths": {REGISTRY: {"auth": auth}}}).to_string();
    cp.create(
        "secrets",
        json!({"metadata": {"name": "regcred", "namespace": "default"},
               "type": "kubernetes.io/dockerconfigjson",
               "data": {".dockerconfigjson": base64::engine::general_purpose::STANDARD.encode(docker_config)}}),
    )
    .unwrap();
    if cp.get("services", "default", "kubernetes").is_none() {
        cp.create(
            "services",
            json!({"metadata": {"name": "kubernetes", "namespace": "default"},
                   "spec": {"ports": [{"name": "https", "port": 443, "protocol": "TCP"}]}}),
        )
        .unwrap();
    }
    let web = cp
        .create(
            "services",
            json!({"metadata": {"name": "web-front", "namespace": "default"},
                   "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}}),
        )
        .unwrap();
    let web_ip = web["spec"]["clusterIP"].as_str().unwrap().to_string();
    cp.create(
        "runtimeclasses.node.k8s.io",
        json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
               "metadata": {"name": "plain-runc"}, "handler": "runc"}),
    )
    .unwrap();
    let env_pod = |name: &str, image: &str, extra: Value| {
        let mut spec = json!({"nodeName": NODE, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": image,
                "command": ["sh", "-c", "env | sort; echo END; sleep 3600"]}]});
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        json!({"metadata": {"name": name, "namespace": "default"}, "spec": spec})
    };

    // 1. The pull secret gets the image from the authenticated registry; the RuntimeClass
    //    resolves to runc; the env holds the service links.
    cp.create(
        "pods",
        env_pod(
            "private",
            PRIVATE,
            json!({"imagePullSecrets": [{"name": "regcred"}], "runtimeClassName": "plain-runc"}),
        ),
    )
    .unwrap();
    let pod = pod_until(&cp, &mut kubelet, "private", "Running", |p| {
        p["status"]["phase"] == "Running"
    });
    assert!(
        stats.unauthorized.load(Ordering::SeqCst) >= 1,
        "the registry challenged"
    );
    assert!(
        stats.manifests_served.load(Ordering::SeqCst) >= 1,
        "the registry served"
    );
    let log = wait_for("private's env", Duration::from_secs(30), || {
        let l = node.container_log(&pod, "main");
        l.contains("END").then_some(l)
    });
    println!("env of a pod with service links:\n{log}");
    assert!(log.contains("KUBERNETES_SERVICE_HOST="), "{log}");
    assert!(
        log.contains(&format!("WEB_FRONT_SERVICE_HOST={web_ip}\n")),
        "{log}"
    );
    assert!(log.contains("WEB_FRONT_SERVICE_PORT_HTTP=80\n"), "{log}");
    assert!(
        log.contains(&format!("WEB_FRONT_PORT=tcp://{web_ip}:80\n")),
        "{log}"
    );
    assert!(
        log.contains(&format!("WEB_FRONT_PORT_80_TCP_ADDR={web_ip}\n")),
        "{log}"
    );
    assert!(log.contains("WEB_FRONT_PORT_80_TCP_PROTO=tcp\n"), "{log}");

    // 1b. The image is on the node now, pulled with regcred. A pod without the secret
    //     (IfNotPresent, the default for a tagged image) must pull it with its own (no)
    //     credentials: the registry refuses. With `Never` it fails as if the image were absent.
    let refused_before = stats.unauthorized.load(Ordering::SeqCst);
    cp.create("pods", env_pod("freeloader", PRIVATE, json!({})))
        .unwrap();
    let p = pod_until(&cp, &mut kubelet, "freeloader", "ErrImagePull", |p| {
        matches!(
            waiting_reason(p).as_str(),
            "ErrImagePull" | "ImagePullBackOff"
        )
    });
    println!(
        "a pod without the secret: {}",
        p["status"]["containerStatuses"][0]["state"]
    );
    assert!(
        stats.unauthorized.load(Ordering::SeqCst) > refused_before,
        "the pod without the secret asked the registry"
    );
    let mut never = env_pod("freeloader-never", PRIVATE, json!({}));
    never["spec"]["containers"][0]["imagePullPolicy"] = json!("Never");
    cp.create("pods", never).unwrap();
    let p = pod_until(
        &cp,
        &mut kubelet,
        "freeloader-never",
        "ErrImageNeverPull",
        |p| waiting_reason(p) == "ErrImageNeverPull",
    );
    assert_eq!(
        p["status"]["containerStatuses"][0]["state"]["waiting"]["message"],
        format!("Container image {PRIVATE:?} is not present with pull policy of Never"),
        "{p:#}"
    );
    // The record of the pull: <root-dir>/image_manager/pulled/sha256-..., mode 0600, naming
    // regcred by its UID (never its credentials).
    let secret_uid = cp.get("secrets", "default", "regcred").unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let pulled = node.p("var/lib/kubelet/image_manager/pulled");
    let record = std::fs::read_dir(&pulled)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|f| std::fs::read_to_string(f).is_ok_and(|t| t.contains("\"name\":\"regcred\"")))
        .expect("a pulled record naming regcred");
    let text = std::fs::read_to_string(&record).unwrap();
    println!("pulled record {}: {text}", record.display());
    assert!(
        text.contains(&format!("\"uid\":\"{secret_uid}\"")),
        "{text}"
    );
    assert!(
        text.contains("\"127.0.0.1:5000/private/busybox\""),
        "{text}"
    );
    assert!(!text.contains(PASSWORD), "{text}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&record).unwrap().permissions().mode() & 0o777,
        0o600
    );

    // 2. The same image without usable credentials (a missing secret only warns): ErrImagePull.
    // Pull policy Always: the image is in the store now, and must be pulled again.
    let mut anon = env_pod(
        "anonymous",
        PRIVATE,
        json!({"imagePullSecrets": [{"name": "nope"}]}),
    );
    anon["spec"]["containers"][0]["imagePullPolicy"] = json!("Always");
    cp.create("pods", anon).unwrap();
    let p = pod_until(&cp, &mut kubelet, "anonymous", "ErrImagePull", |p| {
        matches!(
            waiting_reason(p).as_str(),
            "ErrImagePull" | "ImagePullBackOff"
        )
    });
    println!(
        "anonymous pull: {}",
        p["status"]["containerStatuses"][0]["state"]
    );
    // The registry refused it: the pull's failure event names the 401.
    wait_for(
        "a Failed event naming the 401",
        Duration::from_secs(30),
        || has_event(&cp, "Failed", "401 Unauthorized").then_some(()),
    );
    wait_for(
        "FailedToRetrieveImagePullSecret",
        Duration::from_secs(30),
        || {
            has_event(
            &cp,
            "FailedToRetrieveImagePullSecret",
            "Unable to retrieve some image pull secrets (nope); attempting to pull the image may not succeed.",
        )
        .then_some(())
        },
    );

    // 3. An unknown RuntimeClass fails the sandbox with upstream's wording.
    cp.create(
        "pods",
        env_pod(
            "badclass",
            BUSYBOX,
            json!({"runtimeClassName": "missing-class"}),
        ),
    )
    .unwrap();
    wait_for("FailedCreatePodSandBox", Duration::from_secs(30), || {
        has_event(
            &cp,
            "FailedCreatePodSandBox",
            "Failed to create pod sandbox: runtimeclass.node.k8s.io \"missing-class\" not found",
        )
        .then_some(())
    });
    let p = cp.get("pods", "default", "badclass").unwrap();
    assert_ne!(p["status"]["phase"], "Running", "{p:#}");

    // 4. enableServiceLinks: false keeps only the master service's variables. (The private
    //    image with its secret: the rig's busybox has the same image ID, which the kubelet
    //    pulled in step 1, so as upstream it is no longer preloaded; a pod naming it must
    //    verify by pulling, and the rig has no route to Docker Hub.)
    cp.create(
        "pods",
        env_pod(
            "nolinks",
            PRIVATE,
            json!({"enableServiceLinks": false, "imagePullSecrets": [{"name": "regcred"}]}),
        ),
    )
    .unwrap();
    let pod = pod_until(&cp, &mut kubelet, "nolinks", "Running", |p| {
        p["status"]["phase"] == "Running"
    });
    let log = wait_for("nolinks' env", Duration::from_secs(30), || {
        let l = node.container_log(&pod, "main");
        l.contains("END").then_some(l)
    });
    println!("env with enableServiceLinks: false:\n{log}");
    assert!(log.contains("KUBERNETES_SERVICE_HOST="), "{log}");
    assert!(!log.contains("WEB_FRONT_"), "{log}");

    for name in [
        "private",
        "freeloader",
        "freeloader-never",
        "anonymous",
        "badclass",
        "nolinks",
    ] {
        let _ = cp.delete("pods", "default", name, None);
    }
    let pods_dir = node.p("var/lib/kubelet/pods");
    wait_for("pod directories removed", Duration::from_secs(60), || {
        let left = std::fs::read_dir(&pods_dir).map(|d| d.count()).unwrap_or(0);
        (left == 0).then_some(())
    });
    kubelet.stop();
}

/// `--image-credential-provider-config`: a pod without pull secrets pulls the private image
/// with what the test plugin (`src/bin/credential-provider.rs`) gives for the registry; the
/// plugin gets upstream's request for the image's repository. A configuration with a field
/// upstream does not have stops the start with an error naming the file.
#[test]
fn a_credential_provider_plugin_pulls_a_private_image_without_pull_secrets() {
    require_rig!();
    let rig = Rig::up("e2e-credprov");
    let out = rig.sh(&format!("ip addr add {NODE_IP}/32 dev lo"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cp = NetnsControlPlane::start(&rig, Options::default());
    let stats = start_registry(&rig, &cp);
    let node = JoinedNode::write(&cp, &rig);
    let bin_dir = node.p("credential-provider-bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    std::fs::copy(
        env!("CARGO_BIN_EXE_credential-provider"),
        bin_dir.join("test-provider"),
    )
    .unwrap();
    let requests = node.p("credential-provider-requests.log");
    let config = node.p("credential-provider.yaml");
    let good = format!(
        "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n\
         - name: test-provider\n  matchImages: [\"{REGISTRY}\"]\n  defaultCacheDuration: 1m\n\
         \x20 apiVersion: credentialprovider.kubelet.k8s.io/v1\n  args: [creds]\n  env:\n\
         \x20 - {{name: CREDS_USER, value: {USER}}}\n\
         \x20 - {{name: CREDS_PASSWORD, value: {PASSWORD}}}\n\
         \x20 - {{name: CREDS_LOG, value: {}}}\n",
        requests.display()
    );
    let args = |node: &JoinedNode| {
        let mut a = node.command_line();
        a.push(format!(
            "--image-credential-provider-config={}",
            config.display()
        ));
        a.push(format!(
            "--image-credential-provider-bin-dir={}",
            bin_dir.display()
        ));
        a
    };

    // A field upstream does not have: the start stops, naming the file.
    std::fs::write(&config, good.replace("  args:", "  argz:")).unwrap();
    let mut bad = Kubelet::builder(&rig)
        .args(args(&node))
        .log(node.p("kubelet-bad.log"))
        .start();
    let status = wait_for(
        "the kubelet refuses the config",
        Duration::from_secs(60),
        || bad.exited(),
    );
    let log = bad.log_text();
    assert!(!status.success(), "{log}");
    assert!(
        log.contains("Failed to register CRI auth plugins")
            && log.contains(&config.display().to_string())
            && log.contains("argz"),
        "{log}"
    );
    drop(bad);

    std::fs::write(&config, &good).unwrap();
    let mut kubelet = Kubelet::builder(&rig)
        .args(args(&node))
        .log(node.p("kubelet.log"))
        .start();
    wait_for("node registered", Duration::from_secs(60), || {
        if let Some(st) = kubelet.exited() {
            panic!("kubelet exited: {st}\n{}", kubelet.log_text());
        }
        cp.get("nodes", "", NODE)
    });
    cp.create(
        "pods",
        json!({"metadata": {"name": "plugin-creds", "namespace": "default"},
               "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 1,
                        "containers": [{"name": "main", "image": PRIVATE,
                                        "command": ["sleep", "3600"]}]}}),
    )
    .unwrap();
    pod_until(&cp, &mut kubelet, "plugin-creds", "Running", |p| {
        p["status"]["phase"] == "Running"
    });
    assert!(
        stats.manifests_served.load(Ordering::SeqCst) >= 1,
        "the registry served"
    );
    let seen = std::fs::read_to_string(&requests).unwrap_or_default();
    println!("requests the plugin got:\n{seen}");
    let first: Value = serde_json::from_str(seen.lines().next().expect("a request")).unwrap();
    assert_eq!(
        first,
        json!({"kind": "CredentialProviderRequest",
               "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
               "image": "127.0.0.1:5000/private/busybox"})
    );
    kubelet.stop();
}

/// Issue 30: with `serializeImagePulls: false` two pods' pulls are in flight at once. The
/// test's open registry (127.0.0.1:5001 in the rig's netns) serves the busybox image as two
/// repositories and holds every manifest request 2 s; both pods start, and the registry saw
/// two manifest requests held at the same time (serialized pulls would never overlap).
#[test]
fn parallel_image_pulls_overlap_when_not_serialized() {
    require_rig!();
    const OPEN: &str = "127.0.0.1:5001";
    let (rig, cp, _node, mut kubelet) = node_tests::joined::up_configured(
        "e2e-parpull",
        Options::default(),
        false,
        &[],
        "serializeImagePulls: false\n",
    );
    let stats = start_open_registry(&rig, &cp, OPEN, &["par/a", "par/b"], 2000);
    for (name, repo) in [("par-a", "par/a"), ("par-b", "par/b")] {
        cp.create(
            "pods",
            json!({"metadata": {"name": name, "namespace": "default"},
                   "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 1,
                       "containers": [{"name": "main", "image": format!("{OPEN}/{repo}:1"),
                           "command": ["sleep", "3600"]}]}}),
        )
        .unwrap();
    }
    for name in ["par-a", "par-b"] {
        pod_until(&cp, &mut kubelet, name, "Running", |p| {
            p["status"]["phase"] == "Running"
        });
    }
    let max = stats.max_manifests_in_flight.load(Ordering::SeqCst);
    assert!(
        max >= 2,
        "manifest requests held at once: {max} (served {})\n{}",
        stats.manifests_served.load(Ordering::SeqCst),
        kubelet.log_text()
    );
    drop(kubelet);
}

/// Issue 37.1: a pull secret whose key is 2,000 stars then a label froze the worker thread
/// that matched it (a backtracking glob), inside the serialized pull slot: one such pod held
/// the slot for ever, two pinned both async workers. Now the key is refused (a host label over
/// 63 characters) with a Warning naming the secret, matching is linear and runs on the
/// blocking pool before the slot is taken, and an ordinary pod whose image must be pulled,
/// created after two pods using the secret, starts. Every image comes from the test's open
/// registry in the rig's netns.
#[test]
fn an_ordinary_pod_starts_beside_two_pods_with_a_glob_bomb_pull_secret() {
    require_rig!();
    const OPEN: &str = "127.0.0.1:5001";
    let (rig, cp, _node, mut kubelet) =
        node_tests::joined::up("e2e-globbomb", Options::default(), false);
    start_open_registry(&rig, &cp, OPEN, &["bomb/app", "plain/app"], 0);
    // Four labels and the port, as the registry's address: the match reaches the globs.
    let key = format!("{}x.0.0.1:5001", "*".repeat(2000));
    let docker_config = json!({"auths": {key: {"username": "u", "password": "p"}}}).to_string();
    cp.create(
        "secrets",
        json!({"metadata": {"name": "glob-bomb", "namespace": "default"},
               "type": "kubernetes.io/dockerconfigjson",
               "data": {".dockerconfigjson": base64::engine::general_purpose::STANDARD.encode(docker_config)}}),
    )
    .unwrap();
    let pod = |name: &str, repo: &str, policy: &str, secret: bool| {
        let mut spec = json!({"nodeName": NODE, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": format!("{OPEN}/{repo}:1"),
                "imagePullPolicy": policy, "command": ["sleep", "3600"]}]});
        if secret {
            spec["imagePullSecrets"] = json!([{"name": "glob-bomb"}]);
        }
        json!({"metadata": {"name": name, "namespace": "default"}, "spec": spec})
    };
    for name in ["bomb-1", "bomb-2"] {
        cp.create("pods", pod(name, "bomb/app", "Always", true))
            .unwrap();
    }
    // Both have reached their pulls (the old code froze right after this event).
    wait_for("the two pods' pulls", Duration::from_secs(60), || {
        if let Some(st) = kubelet.exited() {
            panic!("kubelet exited: {st}\n{}", kubelet.log_text());
        }
        let pulling = cp
            .list("events", Some("default"))
            .iter()
            .filter(|e| {
                e["reason"] == "Pulling"
                    && e["involvedObject"]["name"]
                        .as_str()
                        .is_some_and(|n| n.starts_with("bomb-"))
            })
            .count();
        (pulling >= 2).then_some(())
    });
    let started = std::time::Instant::now();
    cp.create("pods", pod("ordinary", "plain/app", "IfNotPresent", false))
        .unwrap();
    pod_until(&cp, &mut kubelet, "ordinary", "Running", |p| {
        p["status"]["phase"] == "Running"
    });
    println!(
        "the ordinary pod ran {:?} after its creation",
        started.elapsed()
    );
    // The pods with the secret pull too (anonymously: the key was refused).
    for name in ["bomb-1", "bomb-2"] {
        pod_until(&cp, &mut kubelet, name, "Running", |p| {
            p["status"]["phase"] == "Running"
        });
    }
    let refused: Vec<Value> = cp
        .list("events", Some("default"))
        .into_iter()
        .filter(|e| e["reason"] == "RefusedImagePullSecretKey")
        .collect();
    assert!(!refused.is_empty(), "a Warning about the refused key");
    for e in refused {
        let m = e["message"].as_str().unwrap_or("");
        println!("event: {m}");
        assert!(m.contains("pull secret default/glob-bomb"), "{m}");
        assert!(!m.contains("**"), "the event shows no key: {m}");
        assert_eq!(e["type"], "Warning");
        assert_eq!(e["involvedObject"]["kind"], "Pod");
    }
    let t = std::time::Instant::now();
    let (body, code) = kubelet.curl_code("http://127.0.0.1:10248/healthz");
    assert_eq!((body.as_str(), code.as_str()), ("ok", "200"));
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    drop(kubelet);
}
