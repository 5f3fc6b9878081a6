//! Whether a regular container restarts (ContainerRestartRules, on in upstream's current
//! release): its `restartPolicyRules` first, in order (the first rule whose exit codes match
//! decides; the only action is `Restart`), then its own `restartPolicy`, then the pod's.

use k8s_openapi::api::core::v1::{Container, ContainerRestartRule, PodSpec};

/// The pod's restart policy (`Always` when unset, as the API defaults it).
pub fn pod_restart_policy(spec: &PodSpec) -> &str {
    spec.restart_policy.as_deref().unwrap_or("Always")
}

/// Whether `exit_code` satisfies `rule`'s exit-code requirement (`In` / `NotIn` its values);
/// a rule without one, or with an unknown operator, matches nothing (upstream).
fn matches(rule: &ContainerRestartRule, exit_code: i32) -> bool {
    let Some(codes) = &rule.exit_codes else {
        return false;
    };
    let listed = codes.values.iter().flatten().any(|v| *v == exit_code);
    match codes.operator.as_str() {
        "In" => listed,
        "NotIn" => !listed,
        _ => false,
    }
}

fn policy_restarts(policy: &str, exit_code: i32) -> Option<bool> {
    match policy {
        "Always" => Some(true),
        "OnFailure" => Some(exit_code != 0),
        "Never" => Some(false),
        _ => None,
    }
}

/// Upstream's ContainerShouldRestart: does regular container `c`, exited with `exit_code`,
/// restart? Rules and the container's policy apply only when the container sets a policy.
pub fn container_should_restart(c: &Container, spec: &PodSpec, exit_code: i32) -> bool {
    if let Some(policy) = c.restart_policy.as_deref() {
        let rule = c
            .restart_policy_rules
            .iter()
            .flatten()
            .find(|r| matches(r, exit_code));
        if rule.is_some_and(|r| r.action == "Restart") {
            return true;
        }
        if let Some(restart) = policy_restarts(policy, exit_code) {
            return restart;
        }
    }
    policy_restarts(pod_restart_policy(spec), exit_code).unwrap_or(true)
}

/// Upstream's IsContainerRestartable: can regular container `c` restart at all (for some
/// exit code)?
pub fn container_restartable(c: &Container, spec: &PodSpec) -> bool {
    if let Some(policy) = c.restart_policy.as_deref() {
        if c.restart_policy_rules
            .iter()
            .flatten()
            .any(|r| r.action == "Restart")
        {
            return true;
        }
        return policy != "Never";
    }
    pod_restart_policy(spec) != "Never"
}

#[cfg(test)]
mod tests;
