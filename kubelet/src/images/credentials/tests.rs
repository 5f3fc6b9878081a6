use super::*;

fn config(location: &str, user: &str, password: &str) -> Vec<u8> {
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!(r#"{{"{location}": {{"email": "foo@bar.baz", "auth": "{auth}"}}}}"#).into_bytes()
}

fn keyring(location: &str) -> Keyring {
    let mut k = Keyring::default();
    k.add(parse_dockercfg(&config(location, "foo", "bar")).unwrap());
    k
}

// Upstream's TestUrlsMatch cases.
#[test]
fn urls_match_as_upstream() {
    let cases = [
        ("*.kubernetes.io", "prefix.kubernetes.io", true),
        ("prefix.*.io", "prefix.kubernetes.io", true),
        ("prefix.kubernetes.*", "prefix.kubernetes.io", true),
        ("*-good.kubernetes.io", "prefix-good.kubernetes.io", true),
        ("*.kubernetes.io/blah", "prefix.kubernetes.io/blah", true),
        ("prefix.*.io/foo", "prefix.kubernetes.io/foo/bar", true),
        (
            "*.kubernetes.io:1111/blah",
            "prefix.kubernetes.io:1111/blah",
            true,
        ),
        (
            "prefix.*.io:1111/foo",
            "prefix.kubernetes.io:1111/foo/bar",
            true,
        ),
        ("*.kubernetes.io", "kubernetes.io", false),
        ("*.*.kubernetes.io", "prefix.kubernetes.io", false),
        ("*.*.kubernetes.io", "kubernetes.io", false),
        ("kubernetes.io", "kubernetes.com", false),
        ("k*.io", "quay.io", false),
        (
            "*.kubernetes.io:1234/blah",
            "prefix.kubernetes.io:1111/blah",
            false,
        ),
        (
            "prefix.*.io/foo",
            "prefix.kubernetes.io:1111/foo/bar",
            false,
        ),
    ];
    for (glob, target, want) in cases {
        assert_eq!(urls_match(glob, target), want, "{glob} vs {target}");
    }
}

// Upstream's TestDockerKeyringForGlob cases: each configured location serves an image
// under the target.
#[test]
fn keyring_finds_globbed_locations() {
    let cases = [
        ("https://hello.kubernetes.io", "hello.kubernetes.io"),
        ("https://*.docker.io", "prefix.docker.io"),
        ("https://prefix.*.io", "prefix.docker.io"),
        ("https://prefix.docker.*", "prefix.docker.io"),
        ("https://*.docker.io/path", "prefix.docker.io/path"),
        ("https://prefix.*.io/path", "prefix.docker.io/path/subpath"),
        ("https://prefix.docker.*/path", "prefix.docker.io/path"),
        ("https://*.docker.io:8888", "prefix.docker.io:8888"),
        ("https://prefix.*.io:8888", "prefix.docker.io:8888"),
        ("https://prefix.docker.*:8888", "prefix.docker.io:8888"),
        (
            "https://*.docker.io/path:1111",
            "prefix.docker.io/path:1111",
        ),
        ("https://*.docker.io/v1/", "prefix.docker.io/path:1111"),
        ("https://*.docker.io/v2/", "prefix.docker.io/path:1111"),
        (
            "https://prefix.docker.*/path:1111",
            "prefix.docker.io/path:1111",
        ),
        ("prefix.docker.io:1111", "prefix.docker.io:1111/path"),
        ("*.docker.io:1111", "prefix.docker.io:1111/path"),
    ];
    for (glob, target) in cases {
        let found = keyring(glob).lookup(&format!("{target}/foo/bar"));
        assert_eq!(found.len(), 1, "{glob} should serve {target}");
        assert_eq!(
            (found[0].username.as_str(), found[0].password.as_str()),
            ("foo", "bar")
        );
    }
}

// Upstream's TestKeyringMiss cases.
#[test]
fn keyring_misses_other_registries() {
    let cases = [
        ("https://hello.kubernetes.io", "world.mesos.org/foo/bar"),
        ("https://*.docker.com", "prefix.docker.io"),
        ("https://suffix.*.io", "prefix.docker.io"),
        ("https://prefix.docker.c*", "prefix.docker.io"),
        (
            "https://prefix.*.io/path:1111",
            "prefix.docker.io/path/subpath:1111",
        ),
        ("suffix.*.io", "prefix.docker.io"),
    ];
    for (glob, target) in cases {
        assert!(
            keyring(glob)
                .lookup(&format!("{target}/foo/bar"))
                .is_empty(),
            "{glob} must not serve {target}"
        );
    }
}

// Upstream's Docker Hub cases: the Hub entry serves unqualified and docker.io images only.
#[test]
fn docker_hub_credentials() {
    let k = keyring("https://index.docker.io/v1/");
    assert!(k.lookup("world.mesos.org/foo/bar").is_empty());
    assert_eq!(k.lookup("google/docker-registry").len(), 1);
    assert_eq!(k.lookup("jenkins").len(), 1);
    assert_eq!(
        k.lookup("index.docker.io/v1//google/docker-registry").len(),
        1
    );
    // Through the normalised repository, as pulls look up.
    assert_eq!(
        lookup_all(std::slice::from_ref(&k), "busybox:1.35").len(),
        1
    );
    assert!(lookup_all(&[k], "localhost:5000/busybox:1.35").is_empty());
}

#[test]
fn default_registry_match_as_upstream() {
    for (image, want) in [
        ("foo/bar", true),
        ("docker.io/foo/bar", true),
        ("index.docker.io/foo/bar", true),
        ("foo", true),
        ("", false),
        ("registry.tld/foo/bar", false),
        ("registry:5000/foo/bar", false),
        ("myhostdocker.io/foo/bar", false),
    ] {
        assert_eq!(is_default_registry(image), want, "{image:?}");
    }
}

#[test]
fn repositories_are_normalised() {
    for (image, want) in [
        ("busybox", "docker.io/library/busybox"),
        ("busybox:1.35", "docker.io/library/busybox"),
        ("foo/bar:tag", "docker.io/foo/bar"),
        ("localhost:5000/team/app:v1", "localhost:5000/team/app"),
        ("localhost/app", "localhost/app"),
        ("10.0.0.1:5000/app@sha256:abcd", "10.0.0.1:5000/app"),
        ("registry.k8s.io/pause:3.10", "registry.k8s.io/pause"),
    ] {
        assert_eq!(repository(image), want, "{image}");
    }
}

#[test]
fn more_specific_paths_come_first_and_all_matches_are_tried() {
    let mut k = Keyring::default();
    k.add(parse_dockercfg(&config("quay.io", "host", "p1")).unwrap());
    k.add(parse_dockercfg(&config("quay.io/coreos", "team", "p2")).unwrap());
    let users: Vec<String> = k
        .lookup("quay.io/coreos/etcd")
        .into_iter()
        .map(|a| a.username)
        .collect();
    assert_eq!(users, ["team", "host"]);
    let users: Vec<String> = k
        .lookup("quay.io/other/etcd")
        .into_iter()
        .map(|a| a.username)
        .collect();
    assert_eq!(users, ["host"]);
}

#[test]
fn config_json_and_secret_data() {
    let auth = base64::engine::general_purpose::STANDARD.encode("u:p:with:colons");
    let json = format!(
        r#"{{"auths": {{"10.0.0.1:5000": {{"auth": "{auth}"}}, "plain.io": {{"username": "a", "password": "b"}}}}}}"#
    );
    let mut data = BTreeMap::new();
    data.insert(DOCKER_CONFIG_JSON_KEY.to_string(), json.into_bytes());
    let k = secret_keyring(&data).unwrap().unwrap();
    let found = lookup_all(std::slice::from_ref(&k), "10.0.0.1:5000/busybox:1.35");
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].username, "u");
    assert_eq!(found[0].password, "p:with:colons");
    assert_eq!(found[0].location, "10.0.0.1:5000");
    assert_eq!(lookup_all(&[k], "plain.io/x")[0].password, "b");
    // An Opaque-looking secret gives nothing; a broken one is an error.
    assert!(secret_keyring(&BTreeMap::new()).unwrap().is_none());
    let mut bad = BTreeMap::new();
    bad.insert(DOCKERCFG_KEY.to_string(), b"{not json".to_vec());
    assert!(secret_keyring(&bad).is_err());
}

#[test]
fn node_config_is_read_from_the_root_dir_first() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(".dockercfg"),
        config("old.example.com", "old", "x"),
    )
    .unwrap();
    let k = read_node_keyring(dir.path());
    assert_eq!(k.lookup("old.example.com/app")[0].username, "old");
    let json = String::from_utf8(config("new.example.com", "new", "y")).unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        format!(r#"{{"auths": {json}}}"#),
    )
    .unwrap();
    let k = read_node_keyring(dir.path());
    assert_eq!(k.lookup("new.example.com/app")[0].username, "new");
    assert!(
        k.lookup("old.example.com/app").is_empty(),
        "config.json wins"
    );
    let paths = node_config_paths(dir.path());
    assert_eq!(paths[0], dir.path().join("config.json"));
    assert!(paths.contains(&PathBuf::from("/.docker/config.json")));
    assert!(paths.contains(&PathBuf::from("/.dockercfg")));
}

/// CVE-2020-8564: a malformed docker config (a pull secret or the node's file) was logged
/// with its contents. The error of a config that does not parse names where and why, never
/// a value of the file: it reaches logs, events and the pod's waiting message.
#[test]
fn cve_2020_8564_a_malformed_docker_config_never_shows_its_contents() {
    const SECRET: &str = "dXNlcjpzM2NyZXQtdmFsdWU=";
    let bodies = [
        // A credential where an entry belongs, in both formats.
        format!(r#"{{"auths": {{"registry.example": "{SECRET}"}}}}"#),
        format!(r#"{{"registry.example": "{SECRET}"}}"#),
        // An entry field of the wrong type, a truncated file, a stray value after the object.
        format!(r#"{{"auths": {{"registry.example": {{"auth": ["{SECRET}"]}}}}}}"#),
        format!(r#"{{"auths": {{"registry.example": {{"auth": "{SECRET}"#),
        format!(r#"{{"auths": {{}}}} "{SECRET}""#),
        // An auth that is not base64 of user:password, and one that is not base64 at all.
        r#"{"auths": {"registry.example": {"auth": "c2VjcmV0LXdpdGhvdXQtY29sb24="}}}"#.to_string(),
        format!(r#"{{"auths": {{"registry.example": {{"auth": "{SECRET}!!"}}}}}}"#),
    ];
    for body in bodies {
        for (key, parse) in [
            (
                DOCKER_CONFIG_JSON_KEY,
                parse_config_json as fn(&[u8]) -> Result<DockerConfig, CredentialError>,
            ),
            (
                DOCKERCFG_KEY,
                parse_dockercfg as fn(&[u8]) -> Result<DockerConfig, CredentialError>,
            ),
        ] {
            let Err(e) = parse(body.as_bytes()) else {
                continue;
            };
            let shown = e.to_string();
            for leak in [SECRET, "secret-without-colon", "s3cret-value"] {
                assert!(!shown.contains(leak), "{key}: {body} gave {shown:?}");
            }
            let data = BTreeMap::from([(key.to_string(), body.as_bytes().to_vec())]);
            let e = secret_keyring(&data).unwrap_err().to_string();
            assert!(!e.contains(SECRET), "{key}: {body} gave {e:?}");
        }
    }
}

// Issue 37.1: a key whose host is over DNS's bounds (a label over 63 bytes, a host over
// 253) is refused and counted; the secret's other keys still serve.
#[test]
fn keys_with_an_over_long_host_are_refused_and_the_rest_kept() {
    let label63 = "a".repeat(63);
    let long_host = vec!["b".repeat(50); 6].join("."); // 305 bytes
    let locations = [
        format!("{}x.io", "*".repeat(2000)),
        format!("{}.io", "c".repeat(64)),
        long_host,
        format!("{label63}.io"),
        "ok.io".to_string(),
    ];
    let mut auths = serde_json::Map::new();
    for l in &locations {
        auths.insert(
            l.clone(),
            serde_json::json!({"username": "u", "password": l}),
        );
    }
    let body = serde_json::json!({ "auths": auths }).to_string();
    let data = BTreeMap::from([(DOCKER_CONFIG_JSON_KEY.to_string(), body.into_bytes())]);
    let k = secret_keyring(&data).unwrap().unwrap();
    assert_eq!(k.refused, 3);
    assert_eq!(k.len(), 2);
    assert_eq!(k.lookup("ok.io/app")[0].password, "ok.io");
    assert_eq!(k.lookup(&format!("{label63}.io/app")).len(), 1);
    assert!(k.lookup("docker.io/library/busybox").is_empty());
}

// An image whose repository is over 255 characters (upstream refuses the name before it
// looks for credentials) matches no key, so its length never multiplies a match's cost.
#[test]
fn an_over_long_repository_matches_no_key() {
    let k = keyring("*.io");
    let long = format!("{}.io/app", "a".repeat(300));
    assert!(lookup_all(std::slice::from_ref(&k), &long).is_empty());
    assert_eq!(lookup_all(&[k], "short.io/app").len(), 1);
}
