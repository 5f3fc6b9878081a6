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
