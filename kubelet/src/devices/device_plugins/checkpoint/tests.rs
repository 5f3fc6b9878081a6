use super::*;

/// Checkpoints written by upstream's kubelet, as published (a cloud vendor's GPU guide and
/// a device plugin walkthrough): their checksums are what upstream computed.
const UPSTREAM_EMPTY: &str = r#"{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"nvidia.com/gpu":["GPU-0650a168-e770-3ea8-8ac3-8a1d419763e0"]}},"Checksum":3952659280}"#;
const UPSTREAM_ONE_POD: &str = r#"{"Data":{"PodDeviceEntries":[{"PodUID":"bf52b2cd-b611-4e79-86b1-280b283185c3","ContainerName":"check","ResourceName":"nvidia.com/gpu","DeviceIDs":{"-1":["tegra"]},"AllocResp":"Ch8KFk5WSURJQV9WSVNJQkxFX0RFVklDRVMSBXRlZ3Jh"}],"RegisteredDevices":{"nvidia.com/gpu":["tegra"]}},"Checksum":3660592824}"#;

#[test]
fn upstream_checkpoints_verify_and_round_trip_byte_for_byte() {
    for text in [UPSTREAM_EMPTY, UPSTREAM_ONE_POD] {
        let (data, boot) = decode(text.as_bytes()).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(boot, "");
        assert_eq!(String::from_utf8(encode(&data, "")).unwrap(), text);
    }
    let (data, _) = decode(UPSTREAM_ONE_POD.as_bytes()).unwrap();
    let e = &data.entries.unwrap()[0];
    assert_eq!(e.device_ids[&-1], vec!["tegra".to_string()]);
    // The stored response is the plugin's protobuf: an env NVIDIA_VISIBLE_DEVICES=tegra.
    let resp =
        <cri_proto::deviceplugin::v1beta1::ContainerAllocateResponse as prost::Message>::decode(
            e.alloc_resp.as_slice(),
        )
        .unwrap();
    assert_eq!(resp.envs["NVIDIA_VISIBLE_DEVICES"], "tegra");
}

#[test]
fn a_changed_byte_is_refused_as_corrupt() {
    let tampered = UPSTREAM_ONE_POD.replace("\"tegra\"]}}", "\"tegrb\"]}}");
    assert!(matches!(
        decode(tampered.as_bytes()),
        Err(CheckpointError::Corrupt)
    ));
    assert!(matches!(decode(b"{"), Err(CheckpointError::Parse(_))));
}

#[test]
fn boot_id_is_outside_the_checksum() {
    let (data, _) = decode(UPSTREAM_EMPTY.as_bytes()).unwrap();
    let with_boot = encode(&data, "b00t");
    let text = String::from_utf8(with_boot.clone()).unwrap();
    assert!(
        text.ends_with(r#""Checksum":3952659280,"BootID":"b00t"}"#),
        "{text}"
    );
    assert_eq!(decode(&with_boot).unwrap().1, "b00t");
}

#[test]
fn hostile_strings_round_trip() {
    // Whatever the names hold, what is written reads back.
    let data = Data {
        entries: Some(vec![Entry {
            pod_uid: "u\"1".into(),
            container_name: "c\n".into(),
            resource_name: "example.com/foo".into(),
            device_ids: [(-1, vec!["dev\u{0}".into()]), (1, vec![])].into(),
            alloc_resp: vec![],
        }]),
        registered: Some(BTreeMap::new()),
    };
    assert_eq!(decode(&encode(&data, "")).unwrap().0, data);
}
