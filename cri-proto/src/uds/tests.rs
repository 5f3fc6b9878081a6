use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::hpack::put_int;
use super::*;

/// `:authority` as grpc-python sends it for `unix:/run/x.sock`.
const PY_AUTHORITY: &[u8] = b"%2Frun%2Fx.sock";

fn literal(out: &mut Vec<u8>, s: &[u8], huffman_coded: bool) {
    if huffman_coded {
        let h = huffman::encode(s);
        put_int(out, 0x80, 7, h.len());
        out.extend_from_slice(&h);
    } else {
        put_int(out, 0x00, 7, s.len());
        out.extend_from_slice(s);
    }
}

/// A gRPC request's header block for `path` with `authority` stored in the dynamic table
/// (literal with incremental indexing, name `:authority` from the static table).
fn request_block(path: &[u8], authority: &[u8], huffman_coded: bool) -> Vec<u8> {
    let mut b = vec![0x83, 0x86]; // :method POST, :scheme http
    b.push(0x44); // :path, literal with indexing, static name 4
    literal(&mut b, path, huffman_coded);
    b.push(0x41); // :authority, literal with indexing, static name 1
    literal(&mut b, authority, huffman_coded);
    b.push(0x5f); // content-type (static 31), literal with indexing
    literal(&mut b, b"application/grpc", huffman_coded);
    b.push(0x00); // te, literal without indexing, new name
    literal(&mut b, b"te", huffman_coded);
    literal(&mut b, b"trailers", huffman_coded);
    b
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    f.extend_from_slice(&[kind, flags]);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

fn run(input: &[u8]) -> Vec<u8> {
    let mut r = Rewriter::default();
    // Byte by byte: frames split over reads must come out whole.
    for b in input {
        r.feed(std::slice::from_ref(b));
    }
    r.finish();
    r.output[r.out_pos..].to_vec()
}

fn with_preface(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut v = PREFACE.to_vec();
    v.extend(frame(0x4, 0, 0, &[])); // SETTINGS
    for f in frames {
        v.extend_from_slice(f);
    }
    v
}

#[test]
fn huffman_matches_rfc_7541_example() {
    // RFC 7541 C.4.1: "www.example.com".
    let coded = [
        0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff,
    ];
    assert_eq!(huffman::encode(b"www.example.com"), coded);
    assert_eq!(huffman::decode(&coded).unwrap(), b"www.example.com");
    // '0' is 00000: the three bits after it are padding, and padding must be all ones.
    assert_eq!(huffman::decode(&[0x07]).unwrap(), b"0");
    assert_eq!(huffman::decode(&[0x00]), None);
}

#[test]
fn a_valid_authority_passes_byte_for_byte() {
    let block = request_block(b"/runtime.v1.RuntimeService/Version", b"localhost", true);
    let input = with_preface(&[
        frame(HEADERS, END_HEADERS, 1, &block),
        frame(0x0, 1, 1, b"\0\0\0\0\0"),
    ]);
    assert_eq!(run(&input), input);
}

#[test]
fn a_socket_path_authority_becomes_localhost_of_the_same_length() {
    for huffman_coded in [false, true] {
        let block = request_block(
            b"/v1beta1.Registration/Register",
            PY_AUTHORITY,
            huffman_coded,
        );
        // The second request names the first one's :authority by its dynamic index (63:
        // content-type was inserted after it, at 62).
        let again = [0x83, 0x86, 0xbf];
        let input = with_preface(&[
            frame(HEADERS, END_HEADERS, 1, &block),
            frame(HEADERS, END_HEADERS | END_STREAM, 3, &again),
        ]);
        let out = run(&input);
        let mut table = hpack::Table::default();
        let want = b"localhost------";
        assert_eq!(want.len(), PY_AUTHORITY.len());
        let headers_at = PREFACE.len() + FRAME_HEADER;
        let len = u32::from_be_bytes([0, out[headers_at], out[headers_at + 1], out[headers_at + 2]])
            as usize;
        let new_block = &out[headers_at + FRAME_HEADER..headers_at + FRAME_HEADER + len];
        assert_eq!(
            table.rewrite(new_block),
            Ok(None),
            "the output is valid HPACK with a valid authority"
        );
        assert!(
            new_block.windows(want.len()).any(|w| w == want),
            "huffman {huffman_coded}"
        );
        assert_eq!(out[headers_at + 3..headers_at + 5], [HEADERS, END_HEADERS]);
        // The second request is unchanged: its index now names the replaced entry.
        assert!(out.ends_with(&frame(HEADERS, END_HEADERS | END_STREAM, 3, &again)));
    }
}

#[test]
fn padding_priority_and_continuation_are_undone_into_plain_frames() {
    let block = request_block(b"/v1beta1.Registration/Register", PY_AUTHORITY, false);
    let (a, b) = block.split_at(7);
    let mut payload = vec![3]; // pad length
    payload.extend_from_slice(&[0x80, 0, 0, 0, 16]); // priority: exclusive, weight 16
    payload.extend_from_slice(a);
    payload.extend_from_slice(&[0, 0, 0]);
    let input = with_preface(&[
        frame(HEADERS, PADDED | PRIORITY | END_STREAM, 1, &payload),
        frame(CONTINUATION, END_HEADERS, 1, b),
    ]);
    let out = run(&input);
    let h = &out[PREFACE.len() + FRAME_HEADER..];
    assert_eq!(h[3..5], [HEADERS, PRIORITY | END_STREAM | END_HEADERS]);
    assert_eq!(h[9..14], [0x80, 0, 0, 0, 16]);
    let mut expect = block.clone();
    let at = expect
        .windows(PY_AUTHORITY.len())
        .position(|w| w == PY_AUTHORITY)
        .unwrap();
    expect[at..at + PY_AUTHORITY.len()].copy_from_slice(b"localhost------");
    assert_eq!(&h[14..], expect.as_slice());
}

#[test]
fn what_it_cannot_follow_passes_unchanged() {
    // An index past the dynamic table: h2 refuses the block itself (COMPRESSION_ERROR).
    let bad = with_preface(&[frame(HEADERS, END_HEADERS, 1, &[0xff, 0x40])]);
    assert_eq!(run(&bad), bad);
    // Not HTTP/2 at all.
    assert_eq!(run(b"GET / HTTP/1.1\r\n\r\n"), b"GET / HTTP/1.1\r\n\r\n");
    // A block cut short by the end of the connection.
    let cut = with_preface(&[frame(HEADERS, 0, 1, &[0x83])]);
    assert_eq!(run(&cut), cut);
}

/// A gRPC request written by hand the way grpc-python sends it over a unix socket: the
/// server answers it instead of resetting the stream with PROTOCOL_ERROR.
#[tokio::test]
async fn a_fake_cri_answers_a_request_whose_authority_is_the_socket_path() {
    let fake = crate::fake::FakeCri::start().await.unwrap();
    let mut conn = tokio::net::UnixStream::connect(fake.socket())
        .await
        .unwrap();
    let block = request_block(b"/runtime.v1.RuntimeService/Version", PY_AUTHORITY, false);
    let request = with_preface(&[
        frame(HEADERS, END_HEADERS, 1, &block),
        frame(0x0, END_STREAM, 1, &[0, 0, 0, 0, 0]), // an empty VersionRequest
    ]);
    conn.write_all(&request).await.unwrap();
    let mut got = Vec::new();
    let mut kinds = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut buf = [0u8; 4096];
    while !kinds
        .iter()
        .any(|&(k, s, _)| s == 1 && (k == HEADERS || k == 0x3))
    {
        let n = tokio::time::timeout_at(deadline, conn.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "connection closed; frames so far: {kinds:?}");
        got.extend_from_slice(&buf[..n]);
        kinds.clear();
        let mut at = 0;
        while got.len() >= at + FRAME_HEADER {
            let len = u32::from_be_bytes([0, got[at], got[at + 1], got[at + 2]]) as usize;
            if got.len() < at + FRAME_HEADER + len {
                break;
            }
            let stream = u32::from_be_bytes(got[at + 5..at + 9].try_into().unwrap()) & 0x7fff_ffff;
            kinds.push((
                got[at + 3],
                stream,
                got[at + FRAME_HEADER..at + FRAME_HEADER + len].to_vec(),
            ));
            at += FRAME_HEADER + len;
        }
    }
    assert!(
        !kinds.iter().any(|&(k, s, _)| k == 0x3 && s == 1),
        "the stream was reset: {kinds:?}"
    );
    assert_eq!(fake.count("Version"), 1);
}

/// The HEADERS block grpc-python 1.85 (C-core) sent for `unix:/tmp/cap-test.sock`: every
/// name a literal, `:authority` the path without its first slash, percent-encoded.
#[test]
fn grpc_pythons_own_block_is_repaired() {
    let mut block = b"@\x05:path\x06/x.Y/Z@\n:authority\x13tmp%2Fcap-test.sock\x83\x86".to_vec();
    block.extend_from_slice(b"@\x0ccontent-type\x10application/grpc@\x02te\x08trailers");
    let out = run(&with_preface(&[frame(HEADERS, END_HEADERS, 1, &block)]));
    let new_block = &out[PREFACE.len() + 2 * FRAME_HEADER..];
    let want = b"@\n:authority\x13localhost----------";
    assert!(
        new_block.windows(want.len()).any(|w| w == want),
        "{new_block:?}"
    );
    assert_eq!(new_block.len(), block.len());
    assert_eq!(hpack::Table::default().rewrite(new_block), Ok(None));
}
