use super::*;

#[test]
fn accept_key_matches_rfc6455() {
    // RFC 6455 section 1.3's example.
    assert_eq!(
        accept_key("dGhlIHNhbXBsZSBub25jZQ=="),
        "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    );
}

/// A masked client frame.
fn client_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0x80 | opcode, 0x80 | payload.len() as u8];
    let mask = [9u8, 8, 7, 6];
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

/// One SPDY frame: (control type or None for data, stream/first word, flags, payload).
async fn spdy_frame<R: AsyncRead + Unpin>(r: &mut R) -> (Option<u16>, u32, u8, Vec<u8>) {
    let mut h = [0u8; 8];
    r.read_exact(&mut h).await.unwrap();
    let len = u32::from_be_bytes([0, h[5], h[6], h[7]]) as usize;
    let mut p = vec![0u8; len];
    r.read_exact(&mut p).await.unwrap();
    if h[0] & 0x80 != 0 {
        (Some(u16::from_be_bytes([h[2], h[3]])), 0, h[4], p)
    } else {
        (None, u32::from_be_bytes([h[0], h[1], h[2], h[3]]), h[4], p)
    }
}

#[tokio::test]
async fn v5_messages_become_spdy_streams_and_back() {
    let (mut client, client_side) = tokio::io::duplex(4096);
    let (mut runtime, runtime_side) = tokio::io::duplex(4096);
    let flags = StreamFlags {
        stdin: true,
        stdout: true,
        stderr: false,
        tty: false,
    };
    let cancel = CancellationToken::new();
    let task = tokio::spawn(async move {
        translate(
            client_side,
            runtime_side,
            vec![],
            flags,
            Duration::from_secs(60),
            &cancel,
        )
        .await
    });
    // One SYN_STREAM per channel, error first; header blocks are plain zlib stored blocks
    // ending in a sync flush, the first with the zlib header.
    let mut kinds = Vec::new();
    for (i, want_id) in [1u32, 3, 5].into_iter().enumerate() {
        let (kind, _, _, p) = spdy_frame(&mut runtime).await;
        assert_eq!(kind, Some(1));
        assert_eq!(u32::from_be_bytes(p[0..4].try_into().unwrap()), want_id);
        let block = &p[10..];
        assert_eq!(block.starts_with(&[0x78, 0x01]), i == 0);
        assert!(block.ends_with(&[0, 0, 0, 0xff, 0xff]));
        let text = String::from_utf8_lossy(block).to_string();
        assert!(text.contains("streamtype"), "{text}");
        let data = &block[..block.len() - 5];
        kinds.push(
            ["error", "stdin", "stdout"]
                .into_iter()
                .find(|k| data.ends_with(k.as_bytes()))
                .unwrap(),
        );
    }
    assert_eq!(kinds, ["error", "stdin", "stdout"]);

    // Client stdin → stdin stream; v5 close of channel 0 → FIN on it.
    client.write_all(&client_frame(2, b"\0hi")).await.unwrap();
    assert_eq!(spdy_frame(&mut runtime).await, (None, 3, 0, b"hi".to_vec()));
    client.write_all(&client_frame(2, &[255, 0])).await.unwrap();
    assert_eq!(spdy_frame(&mut runtime).await, (None, 3, 1, vec![]));

    // A runtime PING is answered with the same ID.
    runtime
        .write_all(&control(6, 0, &2u32.to_be_bytes()))
        .await
        .unwrap();
    assert_eq!(
        spdy_frame(&mut runtime).await,
        (Some(6), 0, 0, 2u32.to_be_bytes().to_vec())
    );

    // Stream data → a channel message; the error stream is channel 3.
    runtime
        .write_all(&data_frame(5, false, b"out"))
        .await
        .unwrap();
    let mut m = [0u8; 6];
    client.read_exact(&mut m).await.unwrap();
    assert_eq!(m, [0x82, 4, 1, b'o', b'u', b't']);
    runtime
        .write_all(&data_frame(1, false, b"{}"))
        .await
        .unwrap();
    let mut m = [0u8; 5];
    client.read_exact(&mut m).await.unwrap();
    assert_eq!(m, [0x82, 3, 3, b'{', b'}']);

    // GOAWAY ends the session with a normal websocket close.
    runtime.write_all(&control(7, 0, &[0; 8])).await.unwrap();
    let mut m = [0u8; 4];
    client.read_exact(&mut m).await.unwrap();
    assert_eq!(m, [0x88, 2, 0x03, 0xe8]);
    assert!(!task.await.unwrap(), "not an idle timeout");
}

#[tokio::test]
async fn an_idle_translation_is_closed() {
    let (_client, client_side) = tokio::io::duplex(4096);
    let (_runtime, runtime_side) = tokio::io::duplex(4096);
    let cancel = CancellationToken::new();
    let idled = tokio::time::timeout(
        Duration::from_secs(5),
        translate(
            client_side,
            runtime_side,
            vec![],
            StreamFlags {
                stdout: true,
                ..Default::default()
            },
            Duration::from_millis(200),
            &cancel,
        ),
    )
    .await
    .expect("closed by the idle timeout");
    assert!(idled);
}

#[test]
fn v5_is_recognised_among_offers() {
    let mut h = http::HeaderMap::new();
    h.insert(
        http::header::SEC_WEBSOCKET_PROTOCOL,
        http::HeaderValue::from_static("v4.channel.k8s.io, v5.channel.k8s.io"),
    );
    assert!(offers_v5(&h));
    h.insert(
        http::header::SEC_WEBSOCKET_PROTOCOL,
        http::HeaderValue::from_static("v4.channel.k8s.io"),
    );
    assert!(!offers_v5(&h));
}

/// Issue 24: after the idle timeout, the final close frame to a client that stopped reading
/// cannot hold the session forever: the close is bounded and the runtime side is shut down.
#[tokio::test(start_paused = true)]
async fn a_client_that_stops_reading_does_not_hold_a_translated_session() {
    let (client, client_side) = tokio::io::duplex(64);
    let (mut runtime, runtime_side) = tokio::io::duplex(1 << 20);
    let flags = StreamFlags {
        stdin: false,
        stdout: true,
        stderr: false,
        tty: false,
    };
    let cancel = CancellationToken::new();
    let task = tokio::spawn(async move {
        translate(
            client_side,
            runtime_side,
            vec![],
            flags,
            Duration::from_secs(30),
            &cancel,
        )
        .await
    });
    // stdout (stream 3) data: more than the client's 64-byte buffer holds.
    for _ in 0..10 {
        runtime
            .write_all(&data_frame(3, false, &[b'x'; 100]))
            .await
            .unwrap();
    }
    let idled = tokio::time::timeout(Duration::from_secs(3600), task)
        .await
        .expect("the session ends within the idle timeout plus the close bound");
    assert!(idled.unwrap(), "ended by the idle timeout");
    // The runtime side sees the end (after the SYN_STREAMs the kubelet opened).
    let mut buf = vec![0u8; 4096];
    let eof = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match runtime.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(eof.is_ok(), "the runtime connection is closed");
    drop(client);
}
