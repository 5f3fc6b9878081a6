use super::*;

#[test]
fn levels_parse_as_klog_does() {
    assert_eq!(parse_level("4"), Ok(4));
    assert_eq!(parse_level("+7"), Ok(7));
    assert_eq!(parse_level("-1"), Ok(-1));
    for bad in ["", "abc", "4\n", " 4", "4.0", "0x4", "-", "٣"] {
        let e = parse_level(bad).unwrap_err();
        assert!(e.to_string().ends_with("invalid syntax"), "{bad:?}: {e}");
    }
    assert!(
        parse_level("99999999999")
            .unwrap_err()
            .to_string()
            .ends_with("value out of range")
    );
    assert_eq!(level_for(-3), "info");
    assert_eq!(level_for(1), "info");
    assert_eq!(level_for(4), "debug");
    assert_eq!(level_for(5), "trace");
}
