//! The driver choice against the fake runtime's RuntimeConfig answers.

use std::time::Duration;

use super::*;
use crate::runtime::fake::FakeRuntime;

const NO_DELAY: Duration = Duration::ZERO;

#[tokio::test]
async fn the_runtimes_driver_wins_over_the_configured_one() {
    let rt = FakeRuntime::new();
    rt.set_cgroup_driver(RuntimeCgroupDriver::Cgroupfs);
    let d = from_runtime(&rt, CgroupDriver::Systemd, NO_DELAY)
        .await
        .unwrap();
    assert_eq!(d, CgroupDriver::Cgroupfs);
    rt.set_cgroup_driver(RuntimeCgroupDriver::Systemd);
    let d = from_runtime(&rt, CgroupDriver::Cgroupfs, NO_DELAY)
        .await
        .unwrap();
    assert_eq!(d, CgroupDriver::Systemd);
}

#[tokio::test]
async fn a_runtime_without_the_call_keeps_the_configured_driver_after_one_try() {
    let rt = FakeRuntime::new();
    for configured in [CgroupDriver::Systemd, CgroupDriver::Cgroupfs] {
        assert_eq!(
            from_runtime(&rt, configured, NO_DELAY).await.unwrap(),
            configured
        );
    }
    let tries = rt.calls().iter().filter(|c| *c == "RuntimeConfig").count();
    assert_eq!(tries, 2, "one call per start, no retry on Unimplemented");
}

#[tokio::test]
async fn no_linux_answer_keeps_the_configured_driver() {
    let rt = FakeRuntime::new();
    rt.set_cgroup_driver(RuntimeCgroupDriver::NotReported);
    let d = from_runtime(&rt, CgroupDriver::Systemd, NO_DELAY)
        .await
        .unwrap();
    assert_eq!(d, CgroupDriver::Systemd);
}

#[tokio::test]
async fn transient_errors_are_retried_and_three_fail_the_start() {
    let rt = FakeRuntime::new();
    rt.set_cgroup_driver(RuntimeCgroupDriver::Cgroupfs);
    let down = || RuntimeError::Unavailable("RuntimeConfig: connection refused".into());
    rt.fail_next("RuntimeConfig", down());
    rt.fail_next("RuntimeConfig", down());
    let d = from_runtime(&rt, CgroupDriver::Systemd, NO_DELAY)
        .await
        .unwrap();
    assert_eq!(d, CgroupDriver::Cgroupfs, "the third try answers");

    for _ in 0..ATTEMPTS {
        rt.fail_next("RuntimeConfig", down());
    }
    let err = from_runtime(&rt, CgroupDriver::Systemd, NO_DELAY)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("connection refused"), "{err}");
}
