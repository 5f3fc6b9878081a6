use super::*;

#[test]
fn a_pull_failure_reads_as_gos_aggregate_error() {
    let call = |m: &str| RuntimeError::Call {
        op: "PullImage",
        message: m.into(),
    };
    assert_eq!(
        PullFailure::Runtime(vec![call("401 Unauthorized")]).to_string(),
        "PullImage failed: 401 Unauthorized"
    );
    assert_eq!(
        PullFailure::Runtime(vec![call("a"), call("b")]).to_string(),
        "[PullImage failed: a, PullImage failed: b]"
    );
    assert_eq!(
        PullFailure::InvalidPullSecret("pull secret ns/x: bad".into()).to_string(),
        "pull secret ns/x: bad"
    );
}
