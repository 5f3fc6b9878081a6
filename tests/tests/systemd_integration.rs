//! The agent under systemd: sd_notify (READY=1 at once, STATUS= naming what it waits for,
//! watchdog pings while it waits and then while the sync loop turns, none once it is wedged,
//! STOPPING=1 on SIGTERM), the unit files as `systemd-analyze verify` sees them, and the .deb
//! packages installed into a scratch root.

use node_tests::require_rig;
use node_tests::{Kubelet, Rig, bin, repo_root};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Every datagram received within `window`.
fn collect(sock: &UnixDatagram, window: Duration) -> Vec<String> {
    let end = Instant::now() + window;
    let mut out = Vec::new();
    let mut buf = [0u8; 1024];
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        if left.is_zero() {
            break;
        }
        sock.set_read_timeout(Some(left)).unwrap();
        match sock.recv(&mut buf) {
            Ok(n) => out.push(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(_) => break,
        }
    }
    out
}

fn pings(msgs: &[String]) -> usize {
    msgs.iter().filter(|m| *m == "WATCHDOG=1").count()
}

#[test]
fn notify_ready_watchdog_and_stopping() {
    require_rig!();
    let rig = Rig::up("sd-notify");
    let dir = tempfile::tempdir().unwrap();
    let sock_path = dir.path().join("notify");
    let wedge = dir.path().join("wedge");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    let mut agent = Kubelet::builder(&rig)
        .env(&[
            ("NOTIFY_SOCKET", sock_path.to_str().unwrap()),
            // Pings every second.
            ("WATCHDOG_USEC", "2000000"),
            ("KUBELET_TEST_WEDGE_SYNC_LOOP_FILE", wedge.to_str().unwrap()),
        ])
        .start();
    // start() returned once :10248/healthz answered: READY=1 came at the start, and the
    // sync loop's STATUS is queued by now.
    let first = collect(&sock, Duration::from_millis(200));
    assert!(
        first
            .first()
            .is_some_and(|m| m.starts_with("READY=1\nSTATUS=starting")),
        "READY=1 first: {first:?}"
    );
    assert!(
        first.iter().any(|m| m.starts_with("STATUS=serving")),
        "serving once the sync loop runs: {first:?}"
    );
    let running = collect(&sock, Duration::from_secs(5));
    let n = pings(&running);
    assert!(
        (3..=7).contains(&n),
        "about one ping a second for 5 s, got {n}: {running:?}"
    );

    std::fs::write(&wedge, "").unwrap();
    // The loop wedges within a second; pings stop once it has not turned for 3 s.
    let during = collect(&sock, Duration::from_secs(6));
    assert!(
        during
            .iter()
            .any(|m| m.starts_with("STATUS=sync loop stuck for")),
        "the stuck loop is reported: {during:?}"
    );
    let after = collect(&sock, Duration::from_secs(4));
    assert_eq!(pings(&after), 0, "no pings from a wedged loop: {after:?}");
    assert!(
        agent
            .log_text()
            .contains("withholding systemd watchdog pings"),
        "the log says why"
    );

    agent.stop();
    let end = collect(&sock, Duration::from_secs(2));
    assert!(
        end.iter().any(|m| m.starts_with("STOPPING=1")),
        "STOPPING=1 on SIGTERM: {end:?}"
    );
}

/// Issue 38.5: `kubeadm join` restarts a `Type=notify` unit (`TimeoutStartSec=infinity`)
/// without `--no-block`, so READY=1 must not wait for the runtime (or the TLS bootstrap): with
/// containerd stopped (nothing listens on the endpoint) READY=1 comes at once, a STATUS= line
/// names the runtime the agent waits for, the watchdog is pinged while it waits, and SIGTERM
/// brings STOPPING=1.
#[test]
fn ready_at_once_and_status_names_the_stopped_runtime() {
    require_rig!();
    let rig = Rig::up("sd-wait");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let sock_path = d.join("notify");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    let endpoint = format!("unix://{}", d.join("containerd.sock").display());
    std::fs::create_dir_all(d.join("manifests")).unwrap();
    let config = format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nstaticPodPath: {}\npodLogsDir: {}\n\
         authentication:\n  anonymous:\n    enabled: true\n  webhook:\n    enabled: false\nauthorization:\n  mode: AlwaysAllow\n",
        d.join("manifests").display(),
        d.join("logs").display(),
    );
    std::fs::write(d.join("config.yaml"), config).unwrap();
    let mut agent = Kubelet::builder(&rig)
        .args(vec![
            format!("--config={}", d.join("config.yaml").display()),
            format!("--container-runtime-endpoint={endpoint}"),
            format!("--root-dir={}", d.join("root").display()),
            "--hostname-override=rig-node".into(),
        ])
        .log(d.join("kubelet.log"))
        .env(&[
            ("NOTIFY_SOCKET", sock_path.to_str().unwrap()),
            ("WATCHDOG_USEC", "2000000"),
        ])
        .start();
    let msgs = collect(&sock, Duration::from_secs(8));
    assert!(
        msgs.first()
            .is_some_and(|m| m.starts_with("READY=1\nSTATUS=starting")),
        "READY=1 first, before the runtime answers: {msgs:?}\n{}",
        agent.log_text()
    );
    let waiting = format!("STATUS=waiting for the container runtime at {endpoint}");
    assert!(
        msgs.iter().any(|m| m.starts_with(&waiting)),
        "{waiting:?} in {msgs:?}"
    );
    assert!(pings(&msgs) >= 3, "pinged while waiting: {msgs:?}");
    assert!(
        !msgs.iter().any(|m| m.contains("serving")),
        "no runtime, no serving: {msgs:?}"
    );
    assert!(
        agent.exited().is_none(),
        "still waiting:\n{}",
        agent.log_text()
    );
    agent.stop();
    let end = collect(&sock, Duration::from_secs(2));
    assert!(
        end.iter().any(|m| m.starts_with("STOPPING=1")),
        "STOPPING=1 on SIGTERM while waiting: {end:?}"
    );
}

/// Copies the units into a scratch root next to the host's own units, with the binaries where
/// the units expect them, and runs `systemd-analyze verify` there.
#[test]
fn units_pass_systemd_analyze_verify() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("SKIPPED: systemd-analyze is not installed");
        return;
    }
    let host_units = Path::new("/usr/lib/systemd/system");
    if !host_units.join("multi-user.target").exists() {
        eprintln!("SKIPPED: no systemd units under /usr/lib/systemd/system to verify against");
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let sys = root.path().join("usr/lib/systemd/system");
    std::fs::create_dir_all(sys.join("kubelet.service.d")).unwrap();
    std::fs::create_dir_all(root.path().join("usr/bin")).unwrap();
    for e in std::fs::read_dir(host_units).unwrap().flatten() {
        let p = e.path();
        if p.extension()
            .is_some_and(|x| x == "target" || x == "service")
        {
            let _ = std::fs::copy(&p, sys.join(e.file_name()));
        }
    }
    let units = repo_root().join("systemd/units");
    for u in ["kubelet.service", "kube-proxy.service"] {
        std::fs::copy(units.join(u), sys.join(u)).unwrap();
    }
    std::fs::copy(
        units.join("09-node-agent-kubeadm.conf"),
        sys.join("kubelet.service.d/09-node-agent-kubeadm.conf"),
    )
    .unwrap();
    for b in ["kubelet", "kube-proxy"] {
        std::fs::copy(bin(b), root.path().join("usr/bin").join(b)).unwrap();
    }
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg("--man=no")
        .arg(format!("--root={}", root.path().display()))
        .args([
            "/usr/lib/systemd/system/kubelet.service",
            "/usr/lib/systemd/system/kube-proxy.service",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // systemd-analyze exits 0 on unknown settings and only warns: any output is a finding.
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify: {}\n{stderr}",
        out.status
    );
    // The drop-in replaces ExecStart with kubeadm's variables, as kubeadm expects.
    let dropin = std::fs::read_to_string(units.join("09-node-agent-kubeadm.conf")).unwrap();
    assert!(dropin.contains(
        "ExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS"
    ));
}

#[test]
fn debian_packages_install_where_kubeadm_expects() {
    if Command::new("dpkg-deb").arg("--version").output().is_err() {
        eprintln!("SKIPPED: dpkg-deb is not installed");
        return;
    }
    let out_dir = tempfile::tempdir().unwrap();
    let bin_dir = bin("kubelet").parent().unwrap().to_path_buf();
    // Under a group-writable umask, as on many build machines: the modes must not follow it.
    let out = Command::new("bash")
        .arg("-c")
        .arg("umask 002; exec bash \"$0\" \"$@\"")
        .arg(repo_root().join("systemd/package.sh"))
        .args(["--fast", "--bin-dir"])
        .arg(&bin_dir)
        .arg("--out")
        .arg(out_dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "package.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let debs: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    let arch = String::from_utf8(
        Command::new("dpkg")
            .arg("--print-architecture")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let version = format!("1.36.0-agent{}", env!("CARGO_PKG_VERSION"));
    for (pkg, files) in [
        (
            "kubelet",
            &[
                "./usr/bin/kubelet",
                "./usr/bin/node-agent-cni",
                "./usr/lib/systemd/system/kubelet.service",
                "./usr/lib/systemd/system/kubelet.service.d/09-node-agent-kubeadm.conf",
                "./etc/kubernetes/manifests/",
                "./etc/default/kubelet",
            ][..],
        ),
        (
            "kube-proxy",
            &[
                "./usr/bin/kube-proxy",
                "./usr/lib/systemd/system/kube-proxy.service",
                "./etc/default/kube-proxy",
            ][..],
        ),
    ] {
        let deb = out_dir
            .path()
            .join(format!("node-agent-{pkg}_{version}_{}.deb", arch.trim()));
        assert!(
            debs.contains(&deb.display().to_string()),
            "{} in {debs:?}",
            deb.display()
        );
        let list = Command::new("dpkg-deb")
            .arg("-c")
            .arg(&deb)
            .output()
            .unwrap();
        let list = String::from_utf8_lossy(&list.stdout);
        for f in files {
            assert!(
                list.lines().any(|l| l.ends_with(&format!(" {f}"))),
                "{f} in {pkg}:\n{list}"
            );
        }
        // Fixed modes, root-owned: directories 0755, binaries 0755, units 0644.
        for l in list.lines() {
            let mode = l.split_whitespace().next().unwrap_or("");
            let want = if l.ends_with('/') || l.contains("/usr/bin/") {
                if l.ends_with('/') {
                    "drwxr-xr-x"
                } else {
                    "-rwxr-xr-x"
                }
            } else {
                "-rw-r--r--"
            };
            assert_eq!(mode, want, "{l}");
            assert!(l.contains(" root/root "), "{l}");
        }
        let field = |f: &str| {
            let o = Command::new("dpkg-deb")
                .args(["-f"])
                .arg(&deb)
                .arg(f)
                .output()
                .unwrap();
            String::from_utf8_lossy(&o.stdout).trim().to_string()
        };
        // Our own name, standing in for upstream's: apt never takes upstream's package for an
        // upgrade of ours, and kubeadm's `Depends: kubelet (>= …)` is met.
        assert_eq!(field("Package"), format!("node-agent-{pkg}"));
        assert_eq!(field("Version"), version);
        assert_eq!(field("Provides"), format!("{pkg} (= 1.36.0)"));
        assert_eq!(field("Conflicts"), pkg);
        assert_eq!(field("Replaces"), pkg);
        // Install into a scratch root and run the binary from there.
        let root = tempfile::tempdir().unwrap();
        let x = Command::new("dpkg")
            .arg("-x")
            .arg(&deb)
            .arg(root.path())
            .status()
            .unwrap();
        assert!(x.success());
        let v = Command::new(root.path().join("usr/bin").join(pkg))
            .arg("--version")
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&v.stdout).trim(),
            "Kubernetes v1.36.0",
            "{pkg} --version from the installed package"
        );
    }
}
