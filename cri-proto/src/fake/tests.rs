use super::*;

#[test]
fn grpc_timeouts_parse_in_every_unit() {
    assert_eq!(parse_grpc_timeout("2S"), Some(Duration::from_secs(2)));
    assert_eq!(parse_grpc_timeout("250m"), Some(Duration::from_millis(250)));
    assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
    assert_eq!(parse_grpc_timeout("7u"), Some(Duration::from_micros(7)));
    assert_eq!(parse_grpc_timeout("S"), None);
    assert_eq!(parse_grpc_timeout(""), None);
    assert_eq!(parse_grpc_timeout("5x"), None);
}

async fn client(fake: &FakeCri) -> crate::RuntimeServiceClient<crate::Channel> {
    let ch = crate::connect(fake.endpoint(), Duration::from_secs(5))
        .await
        .unwrap();
    crate::runtime_client(ch)
}

fn sandbox(uid: &str) -> crate::v1::RunPodSandboxRequest {
    crate::v1::RunPodSandboxRequest {
        config: Some(crate::v1::PodSandboxConfig {
            metadata: Some(crate::v1::PodSandboxMetadata {
                name: uid.into(),
                uid: uid.into(),
                ..Default::default()
            }),
            labels: [("uid".to_string(), uid.to_string())].into(),
            ..Default::default()
        }),
        runtime_handler: String::new(),
    }
}

/// A fault for `n` calls fails exactly those (each recorded), then the method answers again.
#[tokio::test]
async fn a_fault_for_n_calls_fails_those_and_is_then_gone() {
    let fake = FakeCri::start().await.unwrap();
    let mut c = client(&fake).await;
    fake.fail_times("Version", 2, Code::Unavailable, "down");
    for _ in 0..2 {
        let e = c
            .version(crate::v1::VersionRequest::default())
            .await
            .unwrap_err();
        assert_eq!((e.code(), e.message()), (Code::Unavailable, "down"));
    }
    let v = c
        .version(crate::v1::VersionRequest::default())
        .await
        .unwrap();
    assert_eq!(v.into_inner().runtime_api_version, "v1");
    assert_eq!(fake.methods(), ["Version"; 3]);
}

/// Lists select by label, id and state, as a runtime's do.
#[tokio::test]
async fn lists_honour_the_cri_filters() {
    let fake = FakeCri::start().await.unwrap();
    let mut c = client(&fake).await;
    let a = c
        .run_pod_sandbox(sandbox("a"))
        .await
        .unwrap()
        .into_inner()
        .pod_sandbox_id;
    let b = c
        .run_pod_sandbox(sandbox("b"))
        .await
        .unwrap()
        .into_inner()
        .pod_sandbox_id;
    c.stop_pod_sandbox(crate::v1::StopPodSandboxRequest {
        pod_sandbox_id: b.clone(),
    })
    .await
    .unwrap();
    let list = |filter: crate::v1::PodSandboxFilter| {
        let mut c = c.clone();
        async move {
            c.list_pod_sandbox(crate::v1::ListPodSandboxRequest {
                filter: Some(filter),
            })
            .await
            .unwrap()
            .into_inner()
            .items
            .into_iter()
            .map(|s| s.id)
            .collect::<Vec<_>>()
        }
    };
    let by_label = crate::v1::PodSandboxFilter {
        label_selector: [("uid".to_string(), "a".to_string())].into(),
        ..Default::default()
    };
    assert_eq!(list(by_label).await, vec![a.clone()]);
    let ready = crate::v1::PodSandboxFilter {
        state: Some(crate::v1::PodSandboxStateValue {
            state: crate::v1::PodSandboxState::SandboxReady as i32,
        }),
        ..Default::default()
    };
    assert_eq!(list(ready).await, vec![a]);
    let by_id = crate::v1::PodSandboxFilter {
        id: b.clone(),
        ..Default::default()
    };
    assert_eq!(list(by_id).await, vec![b]);
    // An unknown sandbox's status is NOT_FOUND.
    let e = c
        .pod_sandbox_status(crate::v1::PodSandboxStatusRequest {
            pod_sandbox_id: "nope".into(),
            verbose: false,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
}
