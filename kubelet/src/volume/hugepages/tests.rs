use super::*;

fn pod(containers: serde_json::Value, init: serde_json::Value) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "h", "uid": "u"},
        "spec": {"containers": containers, "initContainers": init}}))
    .unwrap()
}

fn requesting(sizes: &[&str]) -> serde_json::Value {
    let mut r = serde_json::Map::new();
    for s in sizes {
        r.insert(format!("hugepages-{s}"), "4Mi".into());
    }
    r.insert("memory".into(), "64Mi".into());
    serde_json::json!({"name": "c", "image": "i", "resources": {"requests": r, "limits": r}})
}

#[test]
fn the_page_size_comes_from_the_pods_requests_as_upstream() {
    let one = pod(
        serde_json::json!([requesting(&["2Mi"])]),
        serde_json::json!([]),
    );
    assert_eq!(page_size_option("HugePages", &one).unwrap(), "pagesize=2Mi");
    assert_eq!(
        page_size_option("HugePages-2Mi", &one).unwrap(),
        "pagesize=2Mi"
    );
    // Printed as Go's Quantity: 2048Ki is 2Mi.
    let ki = pod(
        serde_json::json!([requesting(&["2048Ki"])]),
        serde_json::json!([]),
    );
    assert_eq!(
        page_size_option("HugePages-2Mi", &ki).unwrap(),
        "pagesize=2Mi"
    );
    // An init container's request counts.
    let init = pod(
        serde_json::json!([{"name": "a", "image": "i"}]),
        serde_json::json!([requesting(&["1Gi"])]),
    );
    assert_eq!(
        page_size_option("HugePages", &init).unwrap(),
        "pagesize=1Gi"
    );

    let two = pod(
        serde_json::json!([requesting(&["2Mi", "1Gi"])]),
        serde_json::json!([]),
    );
    assert_eq!(
        page_size_option("HugePages", &two).unwrap_err().to_string(),
        "medium: HugePages can't be used if container requests multiple huge page sizes"
    );
    assert_eq!(
        page_size_option("HugePages-1Gi", &two).unwrap(),
        "pagesize=1Gi"
    );
    assert_eq!(
        page_size_option("HugePages-1Gi", &one)
            .unwrap_err()
            .to_string(),
        "medium HugePages-1Gi: hugePages storage requested, but there is no resource request for huge pages"
    );
    let none = pod(
        serde_json::json!([{"name": "a", "image": "i"}]),
        serde_json::json!([]),
    );
    assert_eq!(
        page_size_option("HugePages", &none)
            .unwrap_err()
            .to_string(),
        "medium HugePages: hugePages storage requested, but there is no resource request for huge pages"
    );
    assert!(page_size_option("HugePages-lots", &one).is_err());
    assert!(is_huge_page_medium("HugePages") && is_huge_page_medium("HugePages-2Mi"));
    assert!(!is_huge_page_medium("Memory") && !is_huge_page_medium(""));
}
