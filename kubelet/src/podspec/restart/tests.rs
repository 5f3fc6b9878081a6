use super::*;

fn container(v: serde_json::Value) -> Container {
    let mut c = serde_json::json!({"name": "c", "image": "i"});
    for (k, x) in v.as_object().unwrap() {
        c[k] = x.clone();
    }
    serde_json::from_value(c).unwrap()
}

fn spec(policy: &str) -> PodSpec {
    PodSpec {
        restart_policy: Some(policy.into()),
        ..Default::default()
    }
}

#[test]
fn without_a_container_policy_the_pods_policy_decides() {
    let c = container(serde_json::json!({}));
    assert!(container_should_restart(&c, &spec("Always"), 0));
    assert!(container_should_restart(&c, &spec("OnFailure"), 1));
    assert!(!container_should_restart(&c, &spec("OnFailure"), 0));
    assert!(!container_should_restart(&c, &spec("Never"), 1));
    assert!(container_should_restart(&c, &PodSpec::default(), 0));
    // Rules without a container policy are not looked at (upstream).
    let rules_only = container(serde_json::json!({"restartPolicyRules": [
        {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]}));
    assert!(!container_should_restart(&rules_only, &spec("Never"), 42));
}

#[test]
fn the_containers_policy_overrides_the_pods() {
    let never = container(serde_json::json!({"restartPolicy": "Never"}));
    assert!(!container_should_restart(&never, &spec("Always"), 1));
    assert!(!container_restartable(&never, &spec("Always")));
    let on_failure = container(serde_json::json!({"restartPolicy": "OnFailure"}));
    assert!(container_should_restart(&on_failure, &spec("Never"), 3));
    assert!(!container_should_restart(&on_failure, &spec("Never"), 0));
    assert!(container_restartable(&on_failure, &spec("Never")));
}

#[test]
fn the_first_matching_rule_restarts_else_the_policy_decides() {
    let c = container(
        serde_json::json!({"restartPolicy": "Never", "restartPolicyRules": [
        {"action": "Restart", "exitCodes": {"operator": "In", "values": [42, 43]}},
        {"action": "Restart", "exitCodes": {"operator": "NotIn", "values": [0, 1, 42, 43, 137]}}]}),
    );
    let s = spec("Never");
    assert!(container_should_restart(&c, &s, 42));
    assert!(container_should_restart(&c, &s, 7), "NotIn matches 7");
    assert!(!container_should_restart(&c, &s, 0));
    assert!(!container_should_restart(&c, &s, 137));
    assert!(container_restartable(&c, &s));
    // An unknown action or operator matches nothing: the policy decides.
    let odd = container(
        serde_json::json!({"restartPolicy": "Never", "restartPolicyRules": [
        {"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [1]}},
        {"action": "Restart", "exitCodes": {"operator": "Greater", "values": [0]}}]}),
    );
    assert!(!container_should_restart(&odd, &s, 1));
    assert!(!container_should_restart(&odd, &s, 5));
}
