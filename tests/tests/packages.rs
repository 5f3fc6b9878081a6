//! The .deb packages beside upstream's kubeadm and kubectl packages, installed with dpkg into
//! a scratch root and upgraded with apt from a local repository, as an operator's node does:
//! no file belongs to two packages, kubeadm's dependency on `kubelet` is met, kubeadm's drop-in
//! is never ours to overwrite or delete, and `apt upgrade` never swaps upstream's `kubelet`
//! package in for ours.
//!
//! The kubeadm, kubectl and kubelet packages here are stand-ins built by the test with the
//! names, dependencies and files of upstream's packages (kubeadm `Depends: kubelet (>= …),
//! kubectl (>= …)` and ships `kubelet.service.d/10-kubeadm.conf`).

use node_tests::{bin, repo_root};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const KUBEADM_DROPIN: &str = "usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf";
const OUR_DROPIN: &str = "usr/lib/systemd/system/kubelet.service.d/09-node-agent-kubeadm.conf";

fn have(tool: &str) -> bool {
    Command::new(tool).arg("--version").output().is_ok()
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Builds a stand-in package NAME VERSION with extra control lines and (path, content) files.
fn standin(dir: &Path, name: &str, version: &str, extra: &str, files: &[(&str, &str)]) -> PathBuf {
    let tree = dir.join(format!("{name}-{version}"));
    std::fs::create_dir_all(tree.join("DEBIAN")).unwrap();
    let arch =
        String::from_utf8(run(Command::new("dpkg").arg("--print-architecture")).stdout).unwrap();
    std::fs::write(
        tree.join("DEBIAN/control"),
        format!(
            "Package: {name}\nVersion: {version}\nArchitecture: {}\nMaintainer: stand-in <root@localhost>\n{extra}Description: stand-in for upstream's {name}\n",
            arch.trim()
        ),
    )
    .unwrap();
    for (path, content) in files {
        let p = tree.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }
    let deb = dir.join(format!("{name}_{version}.deb"));
    run(Command::new("dpkg-deb")
        .args(["--root-owner-group", "-Zgzip", "--build"])
        .arg(&tree)
        .arg(&deb));
    deb
}

/// The stand-ins of upstream's packages a kubeadm node installs beside the kubelet, and one
/// package that provides what ours depend on (libc6, mount, iptables, conntrack).
struct Upstream {
    base: PathBuf,
    kubectl: PathBuf,
    kubeadm: PathBuf,
}

fn upstream(dir: &Path, version: &str) -> Upstream {
    Upstream {
        base: standin(
            dir,
            "base-standin",
            "1",
            "Provides: libc6, mount, iptables, conntrack\n",
            &[],
        ),
        kubectl: standin(
            dir,
            "kubectl",
            version,
            "",
            &[("usr/bin/kubectl", "kubectl")],
        ),
        kubeadm: standin(
            dir,
            "kubeadm",
            version,
            "Depends: kubelet (>= 1.30.0), kubectl (>= 1.30.0)\n",
            &[
                ("usr/bin/kubeadm", "kubeadm"),
                (KUBEADM_DROPIN, "# kubeadm's own drop-in\n"),
            ],
        ),
    }
}

/// Our two packages, built from the debug binaries by systemd/package.sh.
fn ours(dir: &Path) -> (PathBuf, PathBuf) {
    let out = run(Command::new("bash")
        .arg(repo_root().join("systemd/package.sh"))
        .args(["--fast", "--bin-dir"])
        .arg(bin("kubelet").parent().unwrap())
        .arg("--out")
        .arg(dir));
    let debs: Vec<PathBuf> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(PathBuf::from)
        .collect();
    let find = |name: &str| {
        debs.iter()
            .find(|d| {
                d.file_name()
                    .is_some_and(|f| f.to_string_lossy().starts_with(&format!("{name}_")))
            })
            .unwrap_or_else(|| panic!("{name} in {debs:?}"))
            .clone()
    };
    (find("node-agent-kubelet"), find("node-agent-kube-proxy"))
}

/// A scratch root with an empty dpkg database.
fn dpkg_root() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let db = root.path().join("var/lib/dpkg");
    for d in ["info", "updates", "triggers"] {
        std::fs::create_dir_all(db.join(d)).unwrap();
    }
    std::fs::write(db.join("status"), "").unwrap();
    std::fs::write(db.join("available"), "").unwrap();
    root
}

fn dpkg(root: &Path) -> Command {
    let mut c = Command::new("dpkg");
    c.arg(format!("--root={}", root.display()));
    c
}

fn installed(root: &Path, pkg: &str) -> bool {
    let out = dpkg(root).args(["-s", pkg]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).contains("Status: install ok installed")
}

fn skip_without_dpkg() -> bool {
    if !have("dpkg-deb") || !have("dpkg") {
        eprintln!("SKIPPED: dpkg and dpkg-deb are needed to build and install the packages");
        return true;
    }
    false
}

#[test]
fn our_packages_install_beside_kubeadm_and_kubectl_in_either_order() {
    if skip_without_dpkg() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let up = upstream(dir.path(), "1.36.0-1.1");
    let (kubelet, proxy) = ours(dir.path());

    // kubeadm unpacked before ours in one transaction, and ours first then kubeadm alone.
    let one = dpkg_root();
    run(dpkg(one.path())
        .arg("-i")
        .args([&up.base, &up.kubectl, &up.kubeadm, &kubelet, &proxy]));
    let two = dpkg_root();
    run(dpkg(two.path())
        .arg("-i")
        .args([&up.base, &up.kubectl, &kubelet, &proxy]));
    run(dpkg(two.path()).arg("-i").arg(&up.kubeadm));

    for root in [one.path(), two.path()] {
        for pkg in [
            "kubeadm",
            "kubectl",
            "node-agent-kubelet",
            "node-agent-kube-proxy",
        ] {
            assert!(
                installed(root, pkg),
                "{pkg} installed in {}",
                root.display()
            );
        }
        // Each drop-in has one owner; kubeadm's is kubeadm's content.
        for (file, owner) in [
            (KUBEADM_DROPIN, "kubeadm"),
            (OUR_DROPIN, "node-agent-kubelet"),
        ] {
            let out = run(dpkg(root).arg("-S").arg(format!("/{file}")));
            assert_eq!(
                String::from_utf8_lossy(&out.stdout).trim(),
                format!("{owner}: /{file}")
            );
        }
        assert_eq!(
            std::fs::read_to_string(root.join(KUBEADM_DROPIN)).unwrap(),
            "# kubeadm's own drop-in\n"
        );
        assert_eq!(
            std::fs::read_to_string(root.join("etc/default/kubelet")).unwrap(),
            "KUBELET_EXTRA_ARGS=\n"
        );
        let v = run(Command::new(root.join("usr/bin/kubelet")).arg("--version"));
        assert_eq!(
            String::from_utf8_lossy(&v.stdout).trim(),
            "Kubernetes v1.36.0"
        );
    }

    // Removing ours (kubeadm still wants a kubelet, hence --force-depends) leaves kubeadm's
    // files, and keeps the administrator's /etc/default/kubelet until a purge.
    run(dpkg(two.path()).args(["--force-depends", "-r", "node-agent-kubelet"]));
    assert!(!two.path().join("usr/bin/kubelet").exists());
    assert!(!two.path().join(OUR_DROPIN).exists());
    assert!(two.path().join(KUBEADM_DROPIN).exists());
    assert!(two.path().join("usr/bin/kubeadm").exists());
    assert!(two.path().join("etc/default/kubelet").exists());
}

/// apt, pointed at the scratch root and a local flat repository holding `packages`.
struct Apt {
    args: Vec<String>,
}

impl Apt {
    fn new(root: &Path, repo: &Path, packages: &[PathBuf]) -> Apt {
        let mut index = String::new();
        for deb in packages {
            let name = deb.file_name().unwrap();
            std::fs::copy(deb, repo.join(name)).unwrap();
            let fields = run(Command::new("dpkg-deb").arg("-f").arg(deb)).stdout;
            let sum = run(Command::new("sha256sum").arg(deb)).stdout;
            index += &format!(
                "{}Filename: ./{}\nSize: {}\nSHA256: {}\n\n",
                String::from_utf8_lossy(&fields),
                name.to_string_lossy(),
                std::fs::metadata(deb).unwrap().len(),
                String::from_utf8_lossy(&sum)
                    .split_whitespace()
                    .next()
                    .unwrap()
            );
        }
        std::fs::write(repo.join("Packages"), index).unwrap();
        for d in [
            "etc/apt/apt.conf.d",
            "etc/apt/preferences.d",
            "etc/apt/sources.list.d",
            "var/lib/apt/lists/partial",
            "var/cache/apt/archives/partial",
        ] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::write(
            root.join("etc/apt/sources.list"),
            format!("deb [trusted=yes] file:{} ./\n", repo.display()),
        )
        .unwrap();
        let r = root.display();
        Apt {
            args: vec![
                "-q".into(),
                "-o".into(),
                format!("Dir={r}"),
                "-o".into(),
                format!("Dir::State::status={r}/var/lib/dpkg/status"),
                "-o".into(),
                "Debug::NoLocking=1".into(),
            ],
        }
    }

    fn get(&self, args: &[&str]) -> String {
        let out = run(Command::new("timeout")
            .args(["120", "apt-get"])
            .args(&self.args)
            .args(args));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

#[test]
fn apt_upgrade_never_swaps_upstreams_kubelet_in_for_ours() {
    if skip_without_dpkg() || !have("apt-get") || !have("sha256sum") {
        eprintln!("SKIPPED: apt-get and sha256sum are needed for the upgrade");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let old = upstream(dir.path(), "1.36.0-1.1");
    let (kubelet, proxy) = ours(dir.path());
    let root = dpkg_root();
    run(dpkg(root.path()).arg("-i").args([
        &old.base,
        &old.kubectl,
        &old.kubeadm,
        &kubelet,
        &proxy,
    ]));

    // The repository holds upstream's next patch release of all three.
    let next = tempfile::tempdir().unwrap();
    let new = upstream(next.path(), "1.36.1-1.1");
    let upstream_kubelet = standin(
        next.path(),
        "kubelet",
        "1.36.1-1.1",
        "",
        &[("usr/bin/kubelet", "upstream's kubelet")],
    );
    let repo = tempfile::tempdir().unwrap();
    let apt = Apt::new(
        root.path(),
        repo.path(),
        &[new.kubeadm, new.kubectl, upstream_kubelet],
    );
    apt.get(&["update"]);
    for cmd in ["upgrade", "dist-upgrade"] {
        let plan = apt.get(&["-s", cmd]);
        // apt sees the repository: kubeadm and kubectl move to 1.36.1 ...
        assert!(
            plan.lines()
                .any(|l| l.starts_with("Inst kubeadm [1.36.0-1.1] (1.36.1-1.1")),
            "{cmd}: kubeadm upgraded:\n{plan}"
        );
        // ... and neither upstream's kubelet comes in nor ours goes.
        assert!(
            !plan
                .lines()
                .any(|l| l.starts_with("Inst kubelet") || l.starts_with("Remv node-agent")),
            "{cmd}: upstream's kubelet must not replace ours:\n{plan}"
        );
    }
    let kubelet = std::fs::read(root.path().join("usr/bin/kubelet")).unwrap();
    assert_ne!(kubelet, b"upstream's kubelet");
}
