use super::*;

fn entry() -> ClaimState {
    ClaimState {
        claim_uid: "c-uid".into(),
        claim_name: "gpu".into(),
        namespace: "default".into(),
        pod_uids: ["p-uid".to_string()].into(),
        driver_state: [(
            "dra.example.com".to_string(),
            DriverState {
                devices: Some(vec![Device {
                    pool_name: "node-a".into(),
                    device_name: "dev-0".into(),
                    share_id: None,
                    request_names: Some(vec!["req".into()]),
                    cdi_device_ids: Some(vec!["example.com/dev=dev-0".into()]),
                }]),
            },
        )]
        .into(),
    }
}

#[test]
fn crc32_is_ieee() {
    // The standard check value of CRC-32/ISO-HDLC.
    assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    assert_eq!(crc32(b""), 0);
}

#[test]
fn writes_upstreams_layout() {
    let bytes = encode(&[entry()]);
    let file: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let data = file["Data"].as_str().unwrap();
    assert_eq!(
        file["Checksum"].as_u64().unwrap(),
        u64::from(crc32(data.as_bytes()))
    );
    assert_eq!(
        data,
        concat!(
            r#"{"kind":"DRACheckpoint","apiVersion":"checkpoint.dra.kubelet.k8s.io/v1","Entries":["#,
            r#"{"ClaimUID":"c-uid","ClaimName":"gpu","Namespace":"default","PodUIDs":{"p-uid":{}},"#,
            r#""DriverState":{"dra.example.com":{"Devices":[{"PoolName":"node-a","DeviceName":"dev-0","#,
            r#""ShareID":null,"RequestNames":["req"],"CDIDeviceIDs":["example.com/dev=dev-0"]}]}}}]}"#
        )
    );
    assert_eq!(decode(&bytes).unwrap(), vec![entry()]);
}

#[test]
fn reads_a_file_written_by_upstream() {
    // As upstream's kubelet writes it (nil slices as null, no devices for a driver).
    let data = r#"{"kind":"DRACheckpoint","apiVersion":"checkpoint.dra.kubelet.k8s.io/v1","Entries":[{"ClaimUID":"u1","ClaimName":"c1","Namespace":"ns","PodUIDs":{"a":{},"b":{}},"DriverState":{"d":{"Devices":null}}}]}"#;
    let file = serde_json::json!({"Data": data, "Checksum": crc32(data.as_bytes())});
    let got = decode(file.to_string().as_bytes()).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].pod_uids, ["a".to_string(), "b".to_string()].into());
    assert_eq!(got[0].driver_state["d"].devices, None);
}

#[test]
fn refuses_a_tampered_file() {
    let bytes = encode(&[entry()]);
    let text = String::from_utf8(bytes).unwrap().replace("dev-0", "dev-9");
    assert!(matches!(
        decode(text.as_bytes()),
        Err(CheckpointError::Corrupt { .. })
    ));
    assert!(matches!(decode(b"{"), Err(CheckpointError::Parse(_))));
}
