//! The plan for given observations, as the list of actions a pass carries out.

use super::*;

fn pod(spec: serde_json::Value) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "default", "uid": "u1"},
        "spec": spec,
    }))
    .unwrap()
}

fn app_pod(policy: &str) -> Pod {
    pod(serde_json::json!({
        "restartPolicy": policy,
        "containers": [{"name": "app", "image": "busybox"}],
    }))
}

fn sandbox(id: &str, attempt: u32, state: SandboxState) -> Sandbox {
    Sandbox {
        id: id.into(),
        pod_name: "p".into(),
        pod_namespace: "default".into(),
        pod_uid: "u1".into(),
        attempt,
        state,
        created_at: i64::from(attempt),
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
    }
}

/// Container `id` named `name` in state `state`, of the pod's current spec of it.
fn container(pod: &Pod, id: &str, name: &str, state: ContainerState, exit: i32) -> ContainerStatus {
    let spec = pod.spec.as_ref().unwrap();
    let c = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .find(|c| c.name == name)
        .unwrap();
    ContainerStatus {
        id: id.into(),
        name: name.into(),
        attempt: 0,
        state,
        created_at: 1,
        started_at: 1_000_000_000,
        finished_at: 2_000_000_000,
        exit_code: exit,
        image: "busybox".into(),
        image_ref: String::new(),
        reason: String::new(),
        message: String::new(),
        labels: BTreeMap::new(),
        annotations: [(ANN_CONTAINER_HASH.to_string(), pod::container_hash(c))].into(),
        log_path: String::new(),
    }
}

fn observed(sandboxes: Vec<Sandbox>, containers: Vec<(&str, ContainerStatus)>) -> Observed {
    Observed {
        sandboxes,
        containers: containers
            .into_iter()
            .map(|(sb, c)| (sb.to_string(), c))
            .collect(),
        not_started: HashSet::new(),
        resize_restart: HashSet::new(),
    }
}

fn actions(pod: &Pod, obs: &Observed) -> Vec<Action> {
    plan(pod, obs, &mut Backoff::default(), Instant::now()).actions
}

fn start(name: &str, restart_count: u32) -> Action {
    Action::StartContainer {
        name: name.into(),
        restart_count,
    }
}

fn start_init(name: &str, restart_count: u32) -> Action {
    Action::StartInitContainer {
        name: name.into(),
        restart_count,
    }
}

#[test]
fn a_new_pod_gets_a_sandbox_then_its_containers() {
    let p = app_pod("Always");
    assert_eq!(
        actions(&p, &Observed::default()),
        [Action::CreateSandbox { attempt: 0 }, start("app", 0)]
    );
}

#[test]
fn a_running_pod_needs_nothing() {
    let p = app_pod("Always");
    let obs = observed(
        vec![sandbox("sb", 0, SandboxState::Ready)],
        vec![("sb", container(&p, "c1", "app", ContainerState::Running, 0))],
    );
    assert_eq!(
        plan(&p, &obs, &mut Backoff::default(), Instant::now()),
        Plan::default()
    );
}

#[test]
fn a_dead_sandbox_is_stopped_and_replaced_with_the_next_attempt() {
    let p = app_pod("Always");
    let obs = observed(
        vec![sandbox("sb", 3, SandboxState::NotReady)],
        vec![("sb", container(&p, "c1", "app", ContainerState::Running, 0))],
    );
    assert_eq!(
        actions(&p, &obs),
        [
            Action::KillPod,
            Action::CreateSandbox { attempt: 4 },
            start("app", 1)
        ]
    );
}

#[test]
fn init_containers_start_one_at_a_time_in_order() {
    let p = pod(serde_json::json!({
        "initContainers": [{"name": "i1", "image": "busybox"}, {"name": "i2", "image": "busybox"}],
        "containers": [{"name": "app", "image": "busybox"}],
    }));
    // A new sandbox starts only the first init container.
    assert_eq!(
        actions(&p, &Observed::default()),
        [Action::CreateSandbox { attempt: 0 }, start_init("i1", 0)]
    );
    let sb = || vec![sandbox("sb", 0, SandboxState::Ready)];
    // While it runs, nothing else.
    let running = observed(
        sb(),
        vec![("sb", container(&p, "c1", "i1", ContainerState::Running, 0))],
    );
    assert_eq!(actions(&p, &running), []);
    // Once it succeeded, the next one.
    let done = observed(
        sb(),
        vec![("sb", container(&p, "c1", "i1", ContainerState::Exited, 0))],
    );
    assert_eq!(actions(&p, &done), [start_init("i2", 0)]);
    // Once every init container succeeded, the app containers.
    let all = observed(
        sb(),
        vec![
            ("sb", container(&p, "c2", "i2", ContainerState::Exited, 0)),
            ("sb", container(&p, "c1", "i1", ContainerState::Exited, 0)),
        ],
    );
    assert_eq!(actions(&p, &all), [start("app", 0)]);
}

#[test]
fn a_failed_init_container_under_never_fails_the_pod() {
    let p = pod(serde_json::json!({
        "restartPolicy": "Never",
        "initContainers": [{"name": "i1", "image": "busybox"}],
        "containers": [{"name": "app", "image": "busybox"}],
    }));
    let obs = observed(
        vec![sandbox("sb", 0, SandboxState::Ready)],
        vec![("sb", container(&p, "c1", "i1", ContainerState::Exited, 1))],
    );
    assert_eq!(actions(&p, &obs), [Action::KillPod]);
}

#[test]
fn a_changed_spec_kills_and_replaces_the_container() {
    let old = app_pod("Always");
    let mut new = old.clone();
    new.spec.as_mut().unwrap().containers[0].image = Some("busybox:2".into());
    let obs = observed(
        vec![sandbox("sb", 0, SandboxState::Ready)],
        vec![(
            "sb",
            container(&old, "c1", "app", ContainerState::Running, 0),
        )],
    );
    assert_eq!(
        actions(&new, &obs),
        [
            Action::KillContainer {
                id: "c1".into(),
                name: "app".into()
            },
            start("app", 1)
        ]
    );
}

#[test]
fn a_container_created_but_never_started_is_removed_and_started_again() {
    let p = app_pod("Always");
    let obs = observed(
        vec![sandbox("sb", 0, SandboxState::Ready)],
        vec![("sb", container(&p, "c1", "app", ContainerState::Created, 0))],
    );
    assert_eq!(
        actions(&p, &obs),
        [Action::RemoveContainer { id: "c1".into() }, start("app", 0)]
    );
}

#[test]
fn an_exited_container_restarts_at_once_then_backs_off() {
    let p = app_pod("Always");
    let sb = || vec![sandbox("sb", 0, SandboxState::Ready)];
    let mut backoff = Backoff::default();
    let now = Instant::now();
    let first = observed(
        sb(),
        vec![("sb", container(&p, "c1", "app", ContainerState::Exited, 1))],
    );
    let p1 = plan(&p, &first, &mut backoff, now);
    assert_eq!(p1.actions, [start("app", 1)]);
    // The next exit waits 10 s in CrashLoopBackOff: nothing to do but wake up then.
    let mut second = container(&p, "c2", "app", ContainerState::Exited, 1);
    second
        .annotations
        .insert(ANN_RESTART_COUNT.into(), "1".into());
    let p2 = plan(&p, &observed(sb(), vec![("sb", second)]), &mut backoff, now);
    assert_eq!(p2.actions, []);
    assert_eq!(p2.waiting["app"].reason, "CrashLoopBackOff");
    assert_eq!(p2.wake_after, Some(BACKOFF_INITIAL));
}

#[test]
fn when_every_app_container_is_done_the_pod_is_killed_and_nothing_restarts() {
    let p = pod(serde_json::json!({
        "restartPolicy": "OnFailure",
        "initContainers": [{"name": "side", "image": "busybox", "restartPolicy": "Always"}],
        "containers": [{"name": "app", "image": "busybox"}],
    }));
    let obs = observed(
        vec![sandbox("sb", 0, SandboxState::Ready)],
        vec![
            ("sb", container(&p, "c2", "app", ContainerState::Exited, 0)),
            ("sb", container(&p, "c1", "side", ContainerState::Exited, 1)),
        ],
    );
    assert_eq!(actions(&p, &obs), [Action::KillPod]);
}

#[test]
fn a_pod_stopped_for_good_only_stops_what_still_runs() {
    let p = app_pod("Always");
    let running = observed(
        vec![sandbox("sb", 0, SandboxState::Ready)],
        vec![("sb", container(&p, "c1", "app", ContainerState::Running, 0))],
    );
    assert_eq!(plan_stopped(&running).actions, [Action::KillPod]);
    let gone = observed(
        vec![sandbox("sb", 0, SandboxState::NotReady)],
        vec![("sb", container(&p, "c1", "app", ContainerState::Exited, 0))],
    );
    assert_eq!(plan_stopped(&gone), Plan::default());
}

#[test]
fn actions_read_as_the_log_shows_them() {
    let shown: Vec<String> = [
        Action::KillPod,
        Action::KillContainer {
            id: "c1".into(),
            name: "app".into(),
        },
        Action::CreateSandbox { attempt: 2 },
        start_init("init", 0),
    ]
    .iter()
    .map(ToString::to_string)
    .collect();
    assert_eq!(
        shown,
        [
            "KillPod",
            "KillContainer app (c1)",
            "CreateSandbox attempt=2",
            "StartInitContainer init restartCount=0"
        ]
    );
}
