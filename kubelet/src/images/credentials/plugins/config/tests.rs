use super::*;

const GOOD: &str = r#"
apiVersion: kubelet.config.k8s.io/v1
kind: CredentialProviderConfig
providers:
  - name: ecr-credential-provider
    matchImages: ["*.dkr.ecr.*.amazonaws.com", "registry.example:5000/team"]
    defaultCacheDuration: 12h
    apiVersion: credentialprovider.kubelet.k8s.io/v1
    args: [get-credentials]
    env:
      - name: AWS_PROFILE
        value: node
"#;

fn provider(name: &str) -> ProviderConfig {
    ProviderConfig {
        name: name.into(),
        match_images: vec!["registry.example".into()],
        default_cache_duration: Some(Duration::from_secs(60)),
        api_version: "credentialprovider.kubelet.k8s.io/v1".into(),
        ..Default::default()
    }
}

fn executable(dir: &Path, name: &str) {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn a_good_file_decodes_every_field() {
    let p = decode(Path::new("/etc/cp.yaml"), GOOD).unwrap();
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].name, "ecr-credential-provider");
    assert_eq!(p[0].match_images.len(), 2);
    assert_eq!(
        p[0].default_cache_duration,
        Some(Duration::from_secs(12 * 3600))
    );
    assert_eq!(p[0].args, vec!["get-credentials".to_string()]);
    assert_eq!(p[0].env[0].name, "AWS_PROFILE");
    assert!(validate(&p).is_empty(), "{:?}", validate(&p));
}

#[test]
fn unknown_fields_wrong_kind_and_bad_yaml_name_the_file() {
    let unknown = GOOD.replace("    args:", "    argz:");
    let e = decode(Path::new("/etc/cp.yaml"), &unknown)
        .unwrap_err()
        .to_string();
    assert!(e.contains("/etc/cp.yaml") && e.contains("argz"), "{e}");
    let kind = GOOD.replace(
        "kind: CredentialProviderConfig",
        "kind: KubeletConfiguration",
    );
    let e = decode(Path::new("/etc/cp.yaml"), &kind)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("/etc/cp.yaml") && e.contains("wrong Kind"),
        "{e}"
    );
    let e = decode(Path::new("/x/y.json"), "{not yaml: [")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("error decoding config \"/x/y.json\""), "{e}");
    let no_kind = GOOD.replace("kind: CredentialProviderConfig\n", "");
    assert!(decode(Path::new("a"), &no_kind).is_err());
    let version = GOOD.replace("kubelet.config.k8s.io/v1\n", "kubelet.config.k8s.io/v2\n");
    assert!(decode(Path::new("a"), &version).is_err());
}

#[test]
fn validation_speaks_upstreams_words() {
    assert_eq!(
        validate(&[]),
        vec!["providers: Required value: at least 1 item in plugins is required"]
    );
    let mut bad = provider("a/b c");
    bad.api_version = "credentialprovider.kubelet.k8s.io/v9".into();
    bad.match_images.clear();
    bad.default_cache_duration = None;
    let errs = validate(&[bad, provider(".."), provider("ok"), provider("ok")]);
    let want = [
        "providers.name: Invalid value: \"a/b c\": provider name cannot contain '/'",
        "providers.name: Invalid value: \"a/b c\": provider name cannot contain spaces",
        "providers.apiVersion: Unsupported value: \"credentialprovider.kubelet.k8s.io/v9\": supported values: \"credentialprovider.kubelet.k8s.io/v1\", \"credentialprovider.kubelet.k8s.io/v1alpha1\", \"credentialprovider.kubelet.k8s.io/v1beta1\"",
        "providers.matchImages: Required value: at least 1 item in matchImages is required",
        "providers.defaultCacheDuration: Required value",
        "providers.name: Invalid value: \"..\": provider name cannot be '..'",
        "providers.name: Duplicate value: \"ok\"",
    ];
    assert_eq!(errs, want);
    let mut glob = provider("g");
    glob.match_images = vec!["bad host/x".into()];
    assert!(validate(&[glob])[0].contains("match image is invalid"));
}

#[test]
fn token_attributes_are_validated_as_upstream() {
    let mut p = provider("sa");
    p.api_version = "credentialprovider.kubelet.k8s.io/v1beta1".into();
    p.token_attributes = Some(TokenAttributes {
        require_service_account: Some(false),
        required_service_account_annotation_keys: vec![
            "example.com/role".into(),
            "Bad_/x/y".into(),
        ],
        optional_service_account_annotation_keys: vec!["example.com/role".into()],
        cache_type: "Forever".into(),
        ..Default::default()
    });
    let errs = validate(&[p]).join("\n");
    for want in [
        "providers.tokenAttributes.serviceAccountTokenAudience: Required value",
        "providers.tokenAttributes: Forbidden: tokenAttributes is only supported for credentialprovider.kubelet.k8s.io/v1 API version",
        "requireServiceAccount cannot be false when requiredServiceAccountAnnotationKeys is set",
        "providers.tokenAttributes.requiredServiceAccountAnnotationKeys: Invalid value: \"Bad_/x/y\"",
        "annotation keys cannot be both required and optional",
        "providers.tokenAttributes.cacheType: Unsupported value: \"Forever\": supported values: \"ServiceAccount\", \"Token\"",
    ] {
        assert!(errs.contains(want), "missing {want:?} in\n{errs}");
    }
    let mut ok = provider("sa");
    ok.token_attributes = Some(TokenAttributes {
        service_account_token_audience: "registry.example".into(),
        require_service_account: Some(true),
        cache_type: "ServiceAccount".into(),
        ..Default::default()
    });
    assert!(validate(&[ok.clone()]).is_empty());
    ok.token_attributes.as_mut().unwrap().cache_type.clear();
    assert!(validate(&[ok])[0].contains("cacheType is required"));
}

#[test]
fn a_directory_is_read_in_lexical_order_and_duplicates_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, provider: &str| {
        std::fs::write(
            dir.path().join(name),
            GOOD.replace("ecr-credential-provider", provider),
        )
        .unwrap();
    };
    file("20-b.yaml", "second");
    file("10-a.json.yml", "first");
    file("notes.txt", "ignored");
    std::fs::create_dir(dir.path().join("sub.yaml")).unwrap();
    let got = read(dir.path()).unwrap();
    let names: Vec<&str> = got.iter().map(|p| p.config.name.as_str()).collect();
    assert_eq!(names, ["first", "second"]);
    assert!(got[1].file.ends_with("20-b.yaml"));
    file("30-c.yaml", "first");
    let e = read(dir.path()).unwrap_err().to_string();
    assert!(
        e.contains("duplicate provider name \"first\"") && e.contains("30-c.yaml"),
        "{e}"
    );
    let empty = tempfile::tempdir().unwrap();
    assert!(matches!(read(empty.path()), Err(ConfigError::Empty(_))));
    assert!(matches!(
        read(&dir.path().join("missing")),
        Err(ConfigError::Access { .. })
    ));
}

#[test]
fn load_checks_the_bin_dir_and_each_executable() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("cp.yaml");
    std::fs::write(&cfg, GOOD).unwrap();
    let bin = dir.path().join("bin");
    let e = load(&cfg, &bin).unwrap_err().to_string();
    assert_eq!(
        e,
        format!("plugin binary directory {} did not exist", bin.display())
    );
    std::fs::create_dir(&bin).unwrap();
    let e = load(&cfg, &bin).unwrap_err().to_string();
    assert!(
        e.contains("plugin binary executable") && e.contains("ecr-credential-provider"),
        "{e}"
    );
    std::fs::write(bin.join("ecr-credential-provider"), "not executable").unwrap();
    assert!(
        load(&cfg, &bin)
            .unwrap_err()
            .to_string()
            .contains("error inspecting binary executable")
    );
    executable(&bin, "ecr-credential-provider");
    assert_eq!(load(&cfg, &bin).unwrap().len(), 1);
    std::fs::write(&cfg, GOOD.replace("    defaultCacheDuration: 12h\n", "")).unwrap();
    let e = load(&cfg, &bin).unwrap_err().to_string();
    assert!(
        e.contains(&cfg.display().to_string())
            && e.contains("defaultCacheDuration: Required value"),
        "{e}"
    );
}
