use super::*;

fn file(yaml: &str) -> KubeletConfiguration {
    crate::settings::parse_file("t.yaml", yaml).unwrap()
}

#[test]
fn defaults_are_upstreams() {
    let p = parse(&Flags::default(), &KubeletConfiguration::default()).unwrap();
    assert_eq!(p, PodLimits::default());
    assert!(p.cpu_cfs_quota);
    assert_eq!(p.cpu_cfs_period_us, 100_000);
}

#[test]
fn custom_period_needs_the_gate() {
    let e = parse(&Flags::default(), &file("cpuCFSQuotaPeriod: 50ms\n")).unwrap_err();
    assert!(
        e.to_string()
            .contains("{50ms} requires feature gate CustomCPUCFSQuotaPeriod"),
        "{e}"
    );
    let p = parse(
        &Flags::default(),
        &file("cpuCFSQuotaPeriod: 50ms\nfeatureGates: {CustomCPUCFSQuotaPeriod: true}\n"),
    )
    .unwrap();
    assert_eq!(p.cpu_cfs_period_us, 50_000);
    let e = parse(
        &Flags::default(),
        &file("cpuCFSQuotaPeriod: 2s\nfeatureGates: {CustomCPUCFSQuotaPeriod: true}\n"),
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("must be between 1ms and 1sec"),
        "{e}"
    );
    // 100ms is the default and needs no gate.
    assert!(parse(&Flags::default(), &file("cpuCFSQuotaPeriod: 100ms\n")).is_ok());
}

/// `PodLevelResources` is on unless turned off, by the file or (over it) by the flag.
#[test]
fn pod_level_resources_gate() {
    assert!(
        parse(&Flags::default(), &file("{}\n"))
            .unwrap()
            .pod_level_resources
    );
    let off = file("featureGates: {PodLevelResources: false}\n");
    assert!(!parse(&Flags::default(), &off).unwrap().pod_level_resources);
    let flags = Flags {
        feature_gates: Some([("PodLevelResources".to_string(), "true".to_string())].into()),
        ..Flags::default()
    };
    assert!(parse(&flags, &off).unwrap().pod_level_resources);
}

#[test]
fn pids_quota_and_swap() {
    let p = parse(
        &Flags::default(),
        &file("podPidsLimit: 42\ncpuCFSQuota: false\nmemorySwap: {swapBehavior: LimitedSwap}\n"),
    )
    .unwrap();
    assert_eq!(p.pod_pids_limit, 42);
    assert!(!p.cpu_cfs_quota);
    assert_eq!(p.swap_behavior, SwapBehavior::LimitedSwap);
    assert_eq!(p.single_process_oom_kill, None);
    let p = parse(
        &Flags::default(),
        &file(
            "singleProcessOOMKill: true
",
        ),
    )
    .unwrap();
    assert_eq!(p.single_process_oom_kill, Some(true));
    assert!(
        parse(
            &Flags::default(),
            &file(
                "singleProcessOOMKill: yes-please
"
            )
        )
        .is_err()
    );
    assert!(
        parse(
            &Flags::default(),
            &file("memorySwap: {swapBehavior: Unlimited}\n")
        )
        .is_err()
    );
}
fn flags(args: &[&str]) -> Result<Flags, String> {
    use clap::Parser;
    Flags::try_parse_from(std::iter::once("kubelet").chain(args.iter().copied()))
        .map_err(|e| e.to_string())
}

#[test]
fn deprecated_flags_set_the_limits_and_win_over_the_file() {
    let f = flags(&["--pod-max-pids=64", "--cpu-cfs-quota=false"]).unwrap();
    let p = parse(&f, &KubeletConfiguration::default()).unwrap();
    assert_eq!(p.pod_pids_limit, 64);
    assert!(!p.cpu_cfs_quota);
    // Flag over file, both ways.
    let f = flags(&["--pod-max-pids=-1", "--cpu-cfs-quota"]).unwrap();
    let p = parse(&f, &file("podPidsLimit: 42\ncpuCFSQuota: false\n")).unwrap();
    assert_eq!(p.pod_pids_limit, -1);
    assert!(p.cpu_cfs_quota);
    // pflag's space-separated integer and Go's base prefixes.
    let f = flags(&["--pod-max-pids", "0x40"]).unwrap();
    assert_eq!(
        parse(&f, &file("podPidsLimit: 7\n"))
            .unwrap()
            .pod_pids_limit,
        64
    );
    // Absent flags leave the file's values.
    let p = parse(&flags(&[]).unwrap(), &file("podPidsLimit: 42\n")).unwrap();
    assert_eq!(p.pod_pids_limit, 42);
}

#[test]
fn cfs_period_flag_needs_the_gate_and_the_range() {
    let e = parse(
        &flags(&["--cpu-cfs-quota-period=50ms"]).unwrap(),
        &KubeletConfiguration::default(),
    )
    .unwrap_err();
    assert!(
            e.to_string().contains(
                "cpuCFSQuotaPeriod (--cpu-cfs-quota-period) {50ms} requires feature gate CustomCPUCFSQuotaPeriod"
            ),
            "{e}"
        );
    // The gate from the flag or the file; the flag's period wins over the file's.
    let f = flags(&[
        "--cpu-cfs-quota-period=50ms",
        "--feature-gates=CustomCPUCFSQuotaPeriod=true",
    ])
    .unwrap();
    let p = parse(&f, &file("cpuCFSQuotaPeriod: 20ms\n")).unwrap();
    assert_eq!(p.cpu_cfs_period_us, 50_000);
    let p = parse(
        &flags(&["--cpu-cfs-quota-period=250ms"]).unwrap(),
        &file("featureGates: {CustomCPUCFSQuotaPeriod: true}\n"),
    )
    .unwrap();
    assert_eq!(p.cpu_cfs_period_us, 250_000);
    let e = parse(
        &flags(&["--cpu-cfs-quota-period=1500ms"]).unwrap(),
        &file("featureGates: {CustomCPUCFSQuotaPeriod: true}\n"),
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("{1.5s} must be between 1ms and 1sec, inclusive"),
        "{e}"
    );
    // 100ms is the default: no gate needed, even when the file says otherwise.
    let p = parse(
        &flags(&["--cpu-cfs-quota-period=100ms"]).unwrap(),
        &KubeletConfiguration::default(),
    )
    .unwrap();
    assert_eq!(p.cpu_cfs_period_us, 100_000);
}

#[test]
fn bad_flag_values_are_refused_with_pflags_reasons() {
    for (arg, want) in [
        (
            "--pod-max-pids=lots",
            "strconv.ParseInt: parsing \"lots\": invalid syntax",
        ),
        (
            "--pod-max-pids=99999999999999999999",
            "strconv.ParseInt: parsing \"99999999999999999999\": value out of range",
        ),
        (
            "--cpu-cfs-quota=maybe",
            "strconv.ParseBool: parsing \"maybe\": invalid syntax",
        ),
        ("--cpu-cfs-quota-period=50", "invalid duration \"50\""),
    ] {
        let e = flags(&[arg]).unwrap_err();
        assert!(e.contains(want), "{arg}: {e}");
        let name = arg.split('=').next().unwrap();
        assert!(e.contains(name), "{arg}: {e}");
    }
}
