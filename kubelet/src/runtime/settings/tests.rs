use super::*;
use clap::Parser;

fn flags(args: &[&str]) -> Flags {
    Flags::try_parse_from(std::iter::once("kubelet").chain(args.iter().copied())).unwrap()
}

#[test]
fn container_gc_flags() {
    assert_eq!(
        container_policy(&Flags::default()).unwrap(),
        ContainerGcPolicy::default()
    );
    let p = container_policy(&flags(&[
        "--maximum-dead-containers-per-container=3",
        "--maximum-dead-containers=-1",
        "--minimum-container-ttl-duration=1m",
    ]))
    .unwrap();
    assert_eq!(p.max_per_pod_container, 3);
    assert_eq!(p.max_containers, -1);
    assert_eq!(p.min_age, Duration::from_secs(60));
}
