use super::*;
use PodCgroupPart::*;
use Resource::*;

fn amounts(cpu: i128, mem_mi: i128) -> Amounts {
    Amounts {
        cpu_limit: cpu,
        cpu_request: cpu,
        memory_limit: mem_mi << 20,
    }
}

fn pod(quota: i64, shares: u64, mem_mi: i64) -> PodCgroupValues {
    PodCgroupValues {
        cpu_quota: Some(quota),
        cpu_shares: Some(shares),
        memory: Some(mem_mi << 20),
    }
}

/// Growing: the pod cgroup before the container, per resource, limits before requests.
#[test]
fn a_pod_that_grows_raises_its_cgroup_first() {
    let s = steps(
        Some(pod(10_000, 102, 64)),
        pod(20_000, 204, 128),
        &[(amounts(200, 128), amounts(100, 64))],
    );
    assert_eq!(
        s,
        [
            Step::Pod(MemoryLimit),
            Step::Container(0, Memory),
            Step::Pod(CpuLimit),
            Step::Pod(CpuRequest),
            Step::Container(0, Cpu),
        ]
    );
}

/// Shrinking: the container before the pod cgroup, requests before limits.
#[test]
fn a_pod_that_shrinks_lowers_its_cgroup_last() {
    let s = steps(
        Some(pod(20_000, 204, 128)),
        pod(10_000, 102, 64),
        &[(amounts(100, 64), amounts(200, 128))],
    );
    assert_eq!(
        s,
        [
            Step::Container(0, Memory),
            Step::Pod(MemoryLimit),
            Step::Container(0, Cpu),
            Step::Pod(CpuRequest),
            Step::Pod(CpuLimit),
        ]
    );
}

/// CPU down and memory up at once: each resource keeps its own order (the old single
/// "grows" flag raised the pod first for both and lowered its quota under the container's).
#[test]
fn each_resource_is_ordered_on_its_own() {
    let s = steps(
        Some(pod(10_000, 51, 48)),
        pod(6_000, 51, 96),
        &[(amounts(60, 96), amounts(100, 48))],
    );
    assert_eq!(
        s,
        [
            Step::Pod(MemoryLimit),
            Step::Container(0, Memory),
            Step::Container(0, Cpu),
            Step::Pod(CpuLimit),
        ]
    );
}

/// Two containers trading CPU: the one that shrinks goes first, the pod's total stays.
#[test]
fn container_decreases_go_before_increases() {
    let s = steps(
        Some(pod(30_000, 307, 64)),
        pod(30_000, 307, 64),
        &[
            (amounts(200, 32), amounts(100, 32)),
            (amounts(100, 32), amounts(200, 32)),
        ],
    );
    assert_eq!(s, [Step::Container(1, Cpu), Step::Container(0, Cpu)]);
}

/// Unlimited (`-1` or no limit) is larger than any limit; a pod without a cgroup of its own
/// or without a value gets only container updates; nothing to do is no step.
#[test]
fn unlimited_absent_and_equal_values() {
    let unlimited = PodCgroupValues {
        cpu_quota: Some(-1),
        ..pod(0, 102, 64)
    };
    let s = steps(
        Some(unlimited),
        pod(10_000, 102, 64),
        &[(amounts(100, 64), amounts(0, 64))],
    );
    assert_eq!(s, [Step::Container(0, Cpu), Step::Pod(CpuLimit)]);
    let s = steps(None, pod(1, 2, 3), &[(amounts(100, 64), amounts(200, 64))]);
    assert_eq!(s, [Step::Container(0, Cpu)]);
    let s = steps(Some(pod(10_000, 102, 64)), PodCgroupValues::default(), &[]);
    assert!(s.is_empty());
    assert!(steps(Some(pod(1, 2, 3)), pod(1, 2, 3), &[]).is_empty());
    // Left behind by a failed pass: the pod value alone is written.
    assert_eq!(
        steps(Some(pod(20_000, 2, 3)), pod(10_000, 2, 3), &[]),
        [Step::Pod(CpuLimit)]
    );
}
