use super::*;

fn pod(volumes: serde_json::Value, mounts: serde_json::Value) -> (Pod, Container) {
    let p: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "uid": "u"},
        "spec": {"volumes": volumes,
            "containers": [{"name": "c", "image": "app:1", "volumeMounts": mounts}]}
    }))
    .unwrap();
    let c = p.spec.as_ref().unwrap().containers[0].clone();
    (p, c)
}

#[test]
fn each_mounted_image_volume_is_pulled_with_its_policy_or_upstreams_default() {
    let (p, c) = pod(
        serde_json::json!([
            {"name": "tagged", "image": {"reference": "tools:2"}},
            {"name": "latest", "image": {"reference": "tools"}},
            {"name": "never", "image": {"reference": "tools:3", "pullPolicy": "Never"}},
            {"name": "unmounted", "image": {"reference": "other:1"}},
            {"name": "empty", "emptyDir": {}}
        ]),
        serde_json::json!([
            {"name": "tagged", "mountPath": "/a"},
            {"name": "latest", "mountPath": "/b"},
            {"name": "never", "mountPath": "/c"},
            {"name": "empty", "mountPath": "/d"}
        ]),
    );
    let got: Vec<(String, String, String)> = pulls(&p, &c)
        .into_iter()
        .map(|x| (x.name, x.image.unwrap(), x.image_pull_policy.unwrap()))
        .collect();
    let want = [
        ("c", "tools:2", "IfNotPresent"),
        ("c", "tools", "Always"),
        ("c", "tools:3", "Never"),
    ]
    .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()));
    assert_eq!(got, want);
}
