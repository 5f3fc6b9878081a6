use super::*;
use k8s_openapi::api::core::v1::SELinuxOptions;

fn fedora() -> SeLinuxHost {
    SeLinuxHost {
        enabled: true,
        process_context: "system_u:system_r:container_t:s0".into(),
        file_context: "system_u:object_r:container_file_t:s0".into(),
    }
}

fn opts(user: &str, role: &str, kind: &str, level: &str) -> SELinuxOptions {
    let f = |s: &str| (!s.is_empty()).then(|| s.to_string());
    SELinuxOptions {
        user: f(user),
        role: f(role),
        type_: f(kind),
        level: f(level),
    }
}

fn fixed() -> String {
    "s0:c998,c999".into()
}

#[test]
fn the_file_label_is_the_policys_file_context_with_the_options_user_and_level() {
    let h = fedora();
    assert_eq!(
        h.file_label(&opts("", "", "", "s0:c123,c456"), fixed)
            .unwrap(),
        "system_u:object_r:container_file_t:s0:c123,c456"
    );
    // Role and type are the process's; the file keeps the policy's.
    assert_eq!(
        h.file_label(&opts("staff_u", "staff_r", "spc_t", "s0:c1,c2"), fixed)
            .unwrap(),
        "staff_u:object_r:container_file_t:s0:c1,c2"
    );
    // No level: a fresh MCS level, as go-selinux allocates one.
    assert_eq!(
        h.file_label(&opts("", "", "container_t", ""), fixed)
            .unwrap(),
        "system_u:object_r:container_file_t:s0:c998,c999"
    );
    // Nothing set, or no SELinux: no label.
    assert_eq!(h.file_label(&opts("", "", "", ""), fixed).unwrap(), "");
    assert_eq!(
        SeLinuxHost::disabled()
            .file_label(&opts("", "", "", "s0:c1,c2"), fixed)
            .unwrap(),
        ""
    );
}

#[test]
fn random_levels_are_two_ordered_distinct_categories() {
    for _ in 0..50 {
        let l = random_level();
        let cats = l.strip_prefix("s0:").expect("s0 prefix");
        let (a, b) = cats.split_once(',').expect("two categories");
        let n = |c: &str| c.strip_prefix('c').unwrap().parse::<u32>().unwrap();
        assert!(n(a) < n(b) && n(b) < 1024, "{l}");
    }
}

#[test]
fn the_mount_flag_is_quoted_as_upstream_formats_it() {
    assert_eq!(
        mount_option("system_u:object_r:container_file_t:s0:c15,c25"),
        "context=\"system_u:object_r:container_file_t:s0:c15,c25\""
    );
    assert_eq!(go_quote("a\"b\\c\nd\te"), "\"a\\\"b\\\\c\\nd\\te\"");
    assert_eq!(go_quote("\u{1}"), "\"\\x01\"");
}

#[test]
fn hostile_options_are_refused_before_they_reach_a_mount_flag() {
    let h = fedora();
    for bad in [
        "s0:c1,c2\",rw,exec,context=\"x",
        "s0:c1\\",
        "s0:c1\nfoo",
        "s0\u{0}",
    ] {
        let err = h.file_label(&opts("", "", "", bad), fixed).unwrap_err();
        assert!(err.0.contains("quote, a backslash or a control"), "{err}");
        assert!(!err.0.contains('\n'), "the message is one line: {err}");
    }
    let err = h
        .file_label(&opts("u\"", "", "", "s0:c1,c2"), fixed)
        .unwrap_err();
    assert!(err.0.contains("\"u\\\"\""), "{err}");
    // A comma inside the level is fine: it stays inside the quoted value.
    let l = h.file_label(&opts("", "", "", "s0:c1,c2"), fixed).unwrap();
    assert_eq!(mount_option(&l).matches('"').count(), 2);
}

#[test]
fn the_host_is_read_from_selinuxfs_and_the_policys_lxc_contexts() {
    let d = tempfile::tempdir().unwrap();
    assert_eq!(SeLinuxHost::detect_at(d.path()), SeLinuxHost::disabled());
    std::fs::create_dir_all(d.path().join("sys/fs/selinux")).unwrap();
    std::fs::write(d.path().join("sys/fs/selinux/enforce"), "1").unwrap();
    std::fs::create_dir_all(d.path().join("etc/selinux/targeted/contexts")).unwrap();
    std::fs::write(
        d.path().join("etc/selinux/config"),
        "# comment\nSELINUX=enforcing\nSELINUXTYPE=targeted\n",
    )
    .unwrap();
    std::fs::write(
        d.path().join("etc/selinux/targeted/contexts/lxc_contexts"),
        "process = \"system_u:system_r:container_t:s0\"\n; c\nfile = \"system_u:object_r:container_file_t:s0\"\nro_file=\"system_u:object_r:container_ro_file_t:s0\"\n",
    )
    .unwrap();
    assert_eq!(SeLinuxHost::detect_at(d.path()), fedora());
}

#[test]
fn access_modes_allow_a_label_for_rwop_pvs_and_every_pv_with_the_gate() {
    let m = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert!(access_modes_allow(true, &m(&["ReadWriteOncePod"]), false));
    assert!(!access_modes_allow(true, &m(&["ReadWriteOnce"]), false));
    assert!(!access_modes_allow(
        true,
        &m(&["ReadWriteOncePod", "ReadWriteOnce"]),
        false
    ));
    assert!(access_modes_allow(true, &m(&["ReadWriteMany"]), true));
    assert!(!access_modes_allow(false, &[], true));
    assert_eq!(access_mode_label(false, &[]), "inline");
    assert_eq!(
        access_mode_label(true, &m(&["ReadWriteOnce", "ReadWriteMany"])),
        "RWX"
    );
    assert_eq!(access_mode_label(true, &m(&["ReadWriteOncePod"])), "RWOP");
}
