//! Container image references as upstream reads them (`distribution/reference`'s
//! `ParseNormalizedNamed`, which the kubelet's `parsers.ParseImageName` wraps): short names
//! gain Docker Hub's domain (`busybox:1.35` → `docker.io/library/busybox`), `index.docker.io`
//! becomes `docker.io`, and the reference grammar is checked. Pure.

/// Why a reference does not parse: `distribution/reference`'s errors, worded as upstream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    #[error("invalid reference format")]
    InvalidFormat,
    #[error("invalid reference format: repository name ({0}) must be lowercase")]
    Uppercase(String),
    #[error("repository name must be lowercase")]
    NameContainsUppercase,
    #[error("repository name must have at least one component")]
    NameEmpty,
    #[error("repository name must not be more than 255 characters")]
    NameTooLong,
    #[error("invalid repository name ({0}), cannot specify 64-byte hexadecimal strings")]
    HexIdentifier(String),
    #[error("invalid checksum digest format")]
    DigestFormat,
    #[error("invalid checksum digest length")]
    DigestLength,
    #[error("unsupported digest algorithm")]
    DigestUnsupported,
}

/// A parsed, normalised reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    /// Domain and path, without tag or digest (`docker.io/library/busybox`).
    pub name: String,
    pub tag: Option<String>,
    pub digest: Option<String>,
}

const DEFAULT_DOMAIN: &str = "docker.io";
const LEGACY_DEFAULT_DOMAIN: &str = "index.docker.io";
const OFFICIAL_REPO_PREFIX: &str = "library/";
const NAME_TOTAL_LENGTH_MAX: usize = 255;

/// The repository an image pulls from, without tag or digest, normalised
/// (upstream's `trimImageTagDigest` / `ParseImageName`'s first value).
pub fn repository_name(image: &str) -> Result<String, ReferenceError> {
    parse_normalized_named(image).map(|n| n.name)
}

/// Upstream's `ParseNormalizedNamed`.
pub fn parse_normalized_named(s: &str) -> Result<Named, ReferenceError> {
    if s.len() == 64 && s.bytes().all(|b| matches!(b, b'a'..=b'f' | b'0'..=b'9')) {
        return Err(ReferenceError::HexIdentifier(s.to_string()));
    }
    let (domain, remainder) = split_docker_domain(s);
    let remote = remainder.split(':').next().unwrap_or_default();
    if remote.to_lowercase() != remote {
        return Err(ReferenceError::Uppercase(remote.to_string()));
    }
    parse(&format!("{domain}/{remainder}"))
}

/// `splitDockerDomain`: the first path component is a domain when it has a `.` or `:`, is
/// `localhost` or has upper case letters; otherwise the image is on Docker Hub.
fn split_docker_domain(name: &str) -> (String, String) {
    let (mut domain, mut remainder) = match name.split_once('/') {
        Some((first, rest))
            if first.contains(['.', ':'])
                || first == "localhost"
                || first.to_lowercase() != first =>
        {
            (first.to_string(), rest.to_string())
        }
        _ => (DEFAULT_DOMAIN.to_string(), name.to_string()),
    };
    if domain == LEGACY_DEFAULT_DOMAIN {
        domain = DEFAULT_DOMAIN.into();
    }
    if domain == DEFAULT_DOMAIN && !remainder.contains('/') {
        remainder = format!("{OFFICIAL_REPO_PREFIX}{remainder}");
    }
    (domain, remainder)
}

/// `reference.Parse`: `name[:tag][@digest]` against the reference grammar.
fn parse(s: &str) -> Result<Named, ReferenceError> {
    let Some((name, tag, digest)) = split_reference(s) else {
        if s.is_empty() {
            return Err(ReferenceError::NameEmpty);
        }
        if split_reference(&s.to_lowercase()).is_some() {
            return Err(ReferenceError::NameContainsUppercase);
        }
        return Err(ReferenceError::InvalidFormat);
    };
    if name.len() > NAME_TOTAL_LENGTH_MAX {
        return Err(ReferenceError::NameTooLong);
    }
    if let Some(d) = digest {
        validate_digest(d)?;
    }
    Ok(Named {
        name: name.to_string(),
        tag: tag.map(str::to_string),
        digest: digest.map(str::to_string),
    })
}

/// Matches `s` against `ReferenceRegexp`: (name, tag, digest).
fn split_reference(s: &str) -> Option<(&str, Option<&str>, Option<&str>)> {
    let (name_tag, digest) = match s.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (s, None),
    };
    if digest.is_some_and(|d| !digest_pattern(d)) {
        return None;
    }
    // A tag follows the last ':' when no '/' comes after it.
    let (name, tag) = match name_tag.rfind(':') {
        Some(i) if !name_tag[i..].contains('/') => (&name_tag[..i], Some(&name_tag[i + 1..])),
        _ => (name_tag, None),
    };
    if tag.is_some_and(|t| !tag_pattern(t)) || !name_pattern(name) {
        return None;
    }
    Some((name, tag, digest))
}

fn name_pattern(name: &str) -> bool {
    let parts: Vec<&str> = name.split('/').collect();
    let all_paths = |p: &[&str]| !p.is_empty() && p.iter().all(|c| path_component(c));
    all_paths(&parts) || (parts.len() > 1 && domain_and_port(parts[0]) && all_paths(&parts[1..]))
}

/// `[a-z0-9]+` joined by `.`, `_`, `__` or any run of `-`.
fn path_component(c: &str) -> bool {
    let b = c.as_bytes();
    let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        if !(sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-')) {
            return false;
        }
    }
    true
}

/// `host[:port]`, host a dotted domain name or a bracketed IPv6 address.
fn domain_and_port(d: &str) -> bool {
    let (host, port) = if let Some(rest) = d.strip_prefix('[') {
        let Some((v6, after)) = rest.split_once(']') else {
            return false;
        };
        if v6.is_empty() || !v6.bytes().all(|b| b.is_ascii_hexdigit() || b == b':') {
            return false;
        }
        match after {
            "" => return true,
            p => (None, p.strip_prefix(':')),
        }
    } else {
        match d.split_once(':') {
            Some((h, p)) => (Some(h), Some(p)),
            None => (Some(d), None),
        }
    };
    if let Some(p) = port
        && (p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return false;
    }
    if d.starts_with('[') {
        return port.is_some();
    }
    host.is_some_and(|h| h.split('.').all(domain_component))
}

fn domain_component(c: &str) -> bool {
    let b = c.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|x| x.is_ascii_alphanumeric() || *x == b'-')
}

/// `[\w][\w.-]{0,127}`.
fn tag_pattern(t: &str) -> bool {
    let word = |x: u8| x.is_ascii_alphanumeric() || x == b'_';
    let b = t.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && word(b[0])
        && b.iter().all(|x| word(*x) || *x == b'.' || *x == b'-')
}

/// `algorithm:hex` as the grammar allows (the hex part at least 32 digits).
fn digest_pattern(d: &str) -> bool {
    let Some((alg, hex)) = d.split_once(':') else {
        return false;
    };
    let alg_ok = alg
        .split(['-', '_', '+', '.'])
        .all(|p| p.as_bytes().first().is_some_and(u8::is_ascii_alphabetic))
        && alg
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_+.".contains(&b));
    alg_ok && hex.len() >= 32 && hex.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `digest.Parse`: a known algorithm with an encoded part of its length, lower-case hex.
fn validate_digest(d: &str) -> Result<(), ReferenceError> {
    let (alg, hex) = d.split_once(':').ok_or(ReferenceError::DigestFormat)?;
    let size = match alg {
        "sha256" => 64,
        "sha384" => 96,
        "sha512" => 128,
        _ => return Err(ReferenceError::DigestUnsupported),
    };
    if hex.len() != size {
        return Err(ReferenceError::DigestLength);
    }
    if !hex.bytes().all(|b| matches!(b, b'a'..=b'f' | b'0'..=b'9')) {
        return Err(ReferenceError::DigestFormat);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "sha256:91fb4b041da273d5a3273b6d587d62d518300a6ad268b28628f74997b93171b2";

    #[test]
    fn short_names_are_normalised_to_docker_hub() {
        for (image, want) in [
            ("busybox", "docker.io/library/busybox"),
            ("busybox:1.35", "docker.io/library/busybox"),
            ("library/busybox:1.35", "docker.io/library/busybox"),
            ("team/app", "docker.io/team/app"),
            ("index.docker.io/team/app:v1", "docker.io/team/app"),
            ("docker.io/busybox", "docker.io/library/busybox"),
            (
                "registry.example:5000/team/app:1",
                "registry.example:5000/team/app",
            ),
            ("localhost/app", "localhost/app"),
            ("localhost:5000/app:v2", "localhost:5000/app"),
            ("[::1]:5000/app", "[::1]:5000/app"),
            ("Registry.Example/app", "Registry.Example/app"),
            ("a__b/c-----d.e_f", "docker.io/a__b/c-----d.e_f"),
        ] {
            assert_eq!(repository_name(image).as_deref(), Ok(want), "{image}");
        }
        let n = parse_normalized_named(&format!("hello-world:latest@{SHA}")).unwrap();
        assert_eq!(n.name, "docker.io/library/hello-world");
        assert_eq!(n.tag.as_deref(), Some("latest"));
        assert_eq!(n.digest.as_deref(), Some(SHA));
    }

    #[test]
    fn bad_references_fail_with_upstreams_errors() {
        use ReferenceError::*;
        for (image, want) in [
            ("Busybox", Uppercase("library/Busybox".into())),
            ("team/App:1", Uppercase("team/App".into())),
            ("", InvalidFormat),
            ("a___b", InvalidFormat),
            ("app:", InvalidFormat),
            ("app:-bad", InvalidFormat),
            ("-app", InvalidFormat),
            ("app/", InvalidFormat),
            ("reg.example/app@sha256:abc", InvalidFormat),
            (
                "app@sha256:91FB4B041DA273D5A3273B6D587D62D518300A6AD268B28628F74997B93171B2",
                DigestFormat,
            ),
            (
                "app@md5:91fb4b041da273d5a3273b6d587d62d518300a6ad268b28628f7",
                DigestUnsupported,
            ),
            (
                "app@sha256:91fb4b041da273d5a3273b6d587d62d518300a6ad268b28628f7",
                DigestLength,
            ),
            (&"a".repeat(64), HexIdentifier("a".repeat(64))),
            (&format!("reg.example/{}", "a".repeat(250)), NameTooLong),
        ] {
            assert_eq!(parse_normalized_named(image), Err(want), "{image:?}");
        }
    }
}
