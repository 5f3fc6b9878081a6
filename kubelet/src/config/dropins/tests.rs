use super::*;
use crate::config::{load, load_checked};
use crate::settings::cli::Flags;
use clap::Parser;

const HEAD: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

fn write(dir: &Path, rel: &str, body: &str) -> PathBuf {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, body).unwrap();
    p
}

fn flags(config: Option<&Path>, dir: &Path) -> Flags {
    let mut args = vec!["kubelet".to_string()];
    if let Some(c) = config {
        args.push(format!("--config={}", c.display()));
    }
    args.push(format!("--config-dir={}", dir.display()));
    Flags::parse_from(args)
}

#[test]
fn drop_ins_apply_in_lexical_order_over_the_main_file() {
    let tmp = tempfile::tempdir().unwrap();
    let main = write(
        tmp.path(),
        "config.yaml",
        &format!(
            "{HEAD}maxPods: 50\nclusterDNS: [10.0.0.10, 10.0.0.11]\nserializeImagePulls: true\nevictionHard:\n  memory.available: 200Mi\n"
        ),
    );
    let d = tmp.path().join("conf.d");
    write(&d, "20-last.conf", &format!("{HEAD}maxPods: 30\n"));
    write(
        &d,
        "10-first.conf",
        &format!("{HEAD}maxPods: 20\nclusterDNS: [10.0.0.99]\n"),
    );
    // Subdirectories are walked where they sort; other extensions are not read.
    write(
        &d,
        "15-sub/x.conf",
        &format!("{HEAD}serializeImagePulls: false\n"),
    );
    write(&d, "99-ignored.yaml", "not: [a kubelet config");
    let names: Vec<String> = files(&d)
        .unwrap()
        .iter()
        .map(|p| p.strip_prefix(&d).unwrap().display().to_string())
        .collect();
    assert_eq!(names, ["10-first.conf", "15-sub/x.conf", "20-last.conf"]);
    let cfg = load(&flags(Some(&main), &d), "node").unwrap();
    assert_eq!(cfg.node.max_pods, 30);
    // Lists replace, they do not append.
    assert_eq!(
        cfg.cluster_dns,
        vec!["10.0.0.99".parse::<std::net::IpAddr>().unwrap()]
    );
    assert!(!cfg.images.pull_gate.serialize_image_pulls);
    // A flag still wins over every file.
    let mut f = flags(Some(&main), &d);
    f.max_pods = Some(7);
    assert_eq!(load(&f, "node").unwrap().node.max_pods, 7);
}

#[test]
fn objects_merge_key_by_key_and_null_removes() {
    let mut base = serde_json::json!({"a": {"x": 1, "y": 2}, "b": [1, 2], "c": 3});
    merge_patch(
        &mut base,
        &serde_json::json!({"a": {"y": 20, "z": 30}, "b": [9], "c": null}),
    );
    assert_eq!(
        base,
        serde_json::json!({"a": {"x": 1, "y": 20, "z": 30}, "b": [9]})
    );
}

#[test]
fn a_drop_in_with_an_unknown_field_or_no_kind_stops_the_start_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("conf.d");
    let bad = write(&d, "10-typo.conf", &format!("{HEAD}maxPodz: 20\n"));
    let e = load_checked(&flags(None, &d), &[], "node")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&bad.display().to_string()) && e.contains("unknown field \"maxPodz\""),
        "{e}"
    );
    write(&d, "10-typo.conf", "maxPods: 20\n");
    let e = load(&flags(None, &d), "node").unwrap_err().to_string();
    assert!(
        e.contains("10-typo.conf") && e.contains("'Kind' is missing"),
        "{e}"
    );
    write(
        &d,
        "10-typo.conf",
        &format!("{HEAD}maxPods: [not a number\n"),
    );
    let e = load(&flags(None, &d), "node").unwrap_err().to_string();
    assert!(e.contains("10-typo.conf"), "{e}");
    let e = load(&flags(None, &tmp.path().join("missing")), "node")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("failed to walk through kubelet dropin directory"),
        "{e}"
    );
}

#[test]
fn without_the_main_file_the_drop_ins_are_the_configuration() {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), "a.conf", &format!("{HEAD}maxPods: 12\n"));
    let (cfg, warnings) = load_checked(&flags(None, tmp.path()), &[], "node").unwrap();
    assert_eq!(cfg.node.max_pods, 12);
    assert!(warnings.is_empty(), "{warnings:?}");
}
