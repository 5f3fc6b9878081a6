//! Registry credentials for pulls, as upstream's `pkg/credentialprovider` keyring: docker
//! configs (a pod's `kubernetes.io/dockerconfigjson` / `kubernetes.io/dockercfg` pull
//! secrets, and the node's own `config.json` / `.dockercfg`) indexed by registry location,
//! looked up by the image's repository. Wildcard hosts (`*.example.com`), ports and path
//! prefixes match as upstream's `URLsMatch`; more specific locations come first. Each
//! credential carries its source (the pull secret it came from, or none for the node's) and
//! a hash of its content, as upstream's `TrackedAuthConfig`, for pulled-image credential
//! verification ([`super::pull_records`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use base64::Engine;

use crate::runtime::ImageAuth;

pub mod glob;
pub mod plugins;

/// A docker config that could not be read.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum CredentialError {
    #[error("invalid docker config: {0}")]
    Json(String),
    #[error("invalid auth field for {location:?}: {message}")]
    Auth { location: String, message: String },
}

/// One entry of a docker config: `{"username", "password", "email", "auth"}`; `auth`
/// (base64 `user:password`) wins over the separate fields, as upstream decodes it.
#[derive(Debug, Default, serde::Deserialize)]
struct Entry {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    auth: String,
    #[serde(default)]
    email: String,
}

/// A pull secret's coordinates (upstream's `SecretCoordinates`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecretCoordinates {
    pub uid: String,
    pub namespace: String,
    pub name: String,
}

/// A credential with the hash of its content and where it came from (upstream's
/// `TrackedAuthConfig`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrackedAuth {
    pub auth: ImageAuth,
    /// Upstream's `hashAuthConfig`: SHA-256 (hex) of the credential as Go's JSON encoder
    /// writes `{"username","password","email"}` (empty fields left out).
    pub hash: String,
    /// The pull secret; None for the node's own credentials.
    pub source: Option<SecretCoordinates>,
    /// The service account whose token got it from a credential provider plugin.
    pub service_account: Option<crate::images::pull_records::format::ImagePullServiceAccount>,
}

/// One docker config entry: its location, the credential and the credential's hash.
#[derive(Debug, Clone)]
pub struct ConfigEntry {
    pub location: String,
    pub auth: ImageAuth,
    pub hash: String,
}

/// A string as Go's `encoding/json` writes it (HTML-safe escapes included).
fn go_json_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Upstream's `hashAuthConfig` of a docker config entry.
pub fn hash_auth(username: &str, password: &str, email: &str) -> String {
    use sha2::Digest;
    let mut json = String::from("{");
    for (key, value) in [
        ("username", username),
        ("password", password),
        ("email", email),
    ] {
        if value.is_empty() {
            continue;
        }
        if json.len() > 1 {
            json.push(',');
        }
        json.push_str(&format!("\"{key}\":"));
        go_json_string(value, &mut json);
    }
    json.push('}');
    hex::encode(sha2::Sha256::digest(json.as_bytes()))
}

/// The entries of a `.dockercfg` body (the map itself) or of a `config.json` /
/// `.dockerconfigjson` body (under `auths`).
pub type DockerConfig = Vec<ConfigEntry>;

fn entries(map: BTreeMap<String, Entry>) -> Result<DockerConfig, CredentialError> {
    let mut out = Vec::with_capacity(map.len());
    for (location, e) in map {
        let (mut username, mut password) = (e.username, e.password);
        if !e.auth.is_empty() {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(e.auth.trim())
                .map_err(|err| CredentialError::Auth {
                    location: location.clone(),
                    message: err.to_string(),
                })?;
            let text = String::from_utf8_lossy(&decoded).into_owned();
            let Some((u, p)) = text.split_once(':') else {
                return Err(CredentialError::Auth {
                    location,
                    message: "expected user:password".into(),
                });
            };
            username = u.to_string();
            password = p.trim_matches('\0').to_string();
        }
        out.push(ConfigEntry {
            hash: hash_auth(&username, &password, &e.email),
            auth: ImageAuth {
                username,
                password,
                location: location.clone(),
            },
            location,
        });
    }
    Ok(out)
}

/// serde_json's error without the values it quotes ("invalid type: string \"<the secret>\"
/// ..."): a docker config's bytes never reach a log, an event or a pod's status
/// (CVE-2020-8564). Where and which kind of fault is enough to fix the file.
fn json_error(e: &serde_json::Error) -> CredentialError {
    use serde_json::error::Category;
    let what = match e.classify() {
        Category::Syntax => "not valid JSON",
        Category::Eof => "unexpected end of JSON",
        Category::Data => "a value of the wrong type",
        Category::Io => "unreadable JSON",
    };
    CredentialError::Json(format!("{what} at line {} column {}", e.line(), e.column()))
}

/// A `.dockercfg` body: `{"<registry>": {entry}}`.
pub fn parse_dockercfg(bytes: &[u8]) -> Result<DockerConfig, CredentialError> {
    let map: BTreeMap<String, Entry> = serde_json::from_slice(bytes).map_err(|e| json_error(&e))?;
    entries(map)
}

/// A `config.json` / `.dockerconfigjson` body: `{"auths": {"<registry>": {entry}}}`.
pub fn parse_config_json(bytes: &[u8]) -> Result<DockerConfig, CredentialError> {
    #[derive(serde::Deserialize)]
    struct ConfigJson {
        #[serde(default)]
        auths: BTreeMap<String, Entry>,
    }
    let c: ConfigJson = serde_json::from_slice(bytes).map_err(|e| json_error(&e))?;
    entries(c.auths)
}

/// A registry location split as upstream's `ParseSchemelessURL` + `SplitURL` see it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Location {
    host_parts: Vec<String>,
    port: String,
    path: String,
}

fn parse_location(s: &str) -> Option<Location> {
    let rest = s.split_once("://").map_or(s, |(_, r)| r);
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    // Userinfo is not part of the host.
    let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if authority.is_empty() || authority.contains(char::is_whitespace) {
        return None;
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && p.chars().all(|c| c.is_ascii_digit()) => {
            (h, p.to_string())
        }
        _ => (authority, String::new()),
    };
    let path = path.split(['?', '#']).next().unwrap_or("").to_string();
    Some(Location {
        host_parts: host.split('.').map(str::to_string).collect(),
        port,
        path,
    })
}

/// A key's location with its host labels' globs checked once (None: a malformed glob, Go's
/// `ErrBadPattern`, so the key matches nothing).
#[derive(Debug, Clone)]
struct CompiledKey {
    port: String,
    path: String,
    labels: Option<Vec<glob::Glob>>,
}

impl CompiledKey {
    fn new(location: &str) -> Option<CompiledKey> {
        let l = parse_location(location)?;
        let labels = l
            .host_parts
            .iter()
            .map(|p| glob::Glob::new(p))
            .collect::<Result<_, _>>()
            .ok();
        Some(CompiledKey {
            port: l.port,
            path: l.path,
            labels,
        })
    }

    /// Upstream's `URLsMatch` against a parsed target.
    fn matches(&self, t: &Location) -> bool {
        let Some(labels) = &self.labels else {
            return false;
        };
        self.port == t.port
            && labels.len() == t.host_parts.len()
            && t.path.starts_with(&self.path)
            && labels
                .iter()
                .zip(&t.host_parts)
                .all(|(g, tp)| g.matches(tp))
    }
}

/// Upstream's `URLsMatchStr(glob, target)`: same port, same number of host labels, each
/// label matching as a glob, and the target's path starting with the glob's path.
pub fn urls_match(glob_location: &str, target: &str) -> bool {
    let (Some(g), Some(t)) = (CompiledKey::new(glob_location), parse_location(target)) else {
        return false;
    };
    g.matches(&t)
}

/// The repository an image pulls from, normalised as docker references are
/// (`busybox:1.35` → `docker.io/library/busybox`), without tag or digest.
pub fn repository(image: &str) -> String {
    let name = image.split('@').next().unwrap_or(image);
    let name = match name.rfind(':') {
        Some(i) if !name[i..].contains('/') => &name[..i],
        _ => name,
    };
    let (first, rest) = match name.split_once('/') {
        Some((f, r)) => (f, Some(r)),
        None => (name, None),
    };
    match rest {
        Some(_) if first.contains(['.', ':']) || first == "localhost" => name.to_string(),
        Some(_) => format!("docker.io/{name}"),
        None => format!("docker.io/library/{first}"),
    }
}

/// Upstream's isDefaultRegistryMatch: the image pulls from Docker Hub.
fn is_default_registry(image: &str) -> bool {
    let (first, rest) = match image.split_once('/') {
        Some((f, r)) => (f, Some(r)),
        None => (image, None),
    };
    if first.is_empty() {
        return false;
    }
    match rest {
        None => true,
        Some(_) if first == "docker.io" || first == "index.docker.io" => true,
        Some(_) => !first.contains(['.', ':']),
    }
}

const DEFAULT_REGISTRY_HOST: &str = "index.docker.io";

/// The longest host label a docker config key may have (a DNS label's limit); longer
/// keys are refused, so a key's glob costs at most this many steps per character matched.
pub const MAX_KEY_HOST_LABEL: usize = 63;
/// The longest host a docker config key may have (a DNS name's limit).
pub const MAX_KEY_HOST: usize = 253;
/// Images whose repository is longer are matched against no key: upstream refuses such a
/// name (`repository name must not be more than 255 characters`) before it looks for
/// credentials, and a match costs as much as the target is long.
pub const MAX_REPOSITORY: usize = 255;

/// Whether a key's host is within the bounds (every label at most [`MAX_KEY_HOST_LABEL`]
/// bytes, the host at most [`MAX_KEY_HOST`]).
fn host_within_bounds(loc: &Location) -> bool {
    let host = loc.host_parts.iter().map(|p| p.len() + 1).sum::<usize>() - 1;
    host <= MAX_KEY_HOST && loc.host_parts.iter().all(|p| p.len() <= MAX_KEY_HOST_LABEL)
}

/// Credentials by registry location (upstream's BasicDockerKeyring).
#[derive(Debug, Clone, Default)]
pub struct Keyring {
    /// Keys, reverse-sorted so longer (more specific) locations match first, each compiled
    /// once (None: not a location).
    index: Vec<(String, Option<CompiledKey>)>,
    /// Credentials with their hashes, by location key.
    creds: BTreeMap<String, Vec<(ImageAuth, String)>>,
    /// The pull secret every credential here came from; None for the node's.
    pub source: Option<SecretCoordinates>,
    /// The service account whose token got every credential here from a credential
    /// provider plugin ([`plugins`]); None otherwise.
    pub service_account: Option<crate::images::pull_records::format::ImagePullServiceAccount>,
    /// Keys refused for a host over the bounds ([`MAX_KEY_HOST_LABEL`], [`MAX_KEY_HOST`]);
    /// their credentials are not here.
    pub refused: usize,
}

impl Keyring {
    /// Adds every entry of a docker config; a location that is not a URL is skipped, one
    /// whose host is over the bounds is refused (counted in `refused`).
    pub fn add(&mut self, config: DockerConfig) {
        let mut keys: BTreeSet<String> = self.index.iter().map(|(k, _)| k.clone()).collect();
        for ConfigEntry {
            location,
            auth,
            hash,
        } in config
        {
            let Some(loc) = parse_location(&location) else {
                tracing::warn!(%location, "docker config entry is not a registry location; ignored");
                continue;
            };
            if !host_within_bounds(&loc) {
                // The key may be anything a tenant wrote: its length says enough.
                tracing::warn!(
                    key_bytes = location.len(),
                    "docker config key refused: a host label over {MAX_KEY_HOST_LABEL} bytes or a host over {MAX_KEY_HOST}"
                );
                self.refused += 1;
                continue;
            }
            let mut path = loc.path.as_str();
            if path.starts_with("/v2/") || path.starts_with("/v1/") {
                path = &path[3..];
            }
            let host = if loc.port.is_empty() {
                loc.host_parts.join(".")
            } else {
                format!("{}:{}", loc.host_parts.join("."), loc.port)
            };
            let key = if !path.is_empty() && path != "/" {
                format!("{host}{path}")
            } else {
                host
            };
            self.creds
                .entry(key.clone())
                .or_default()
                .push((auth, hash));
            keys.insert(key);
        }
        self.index = keys
            .into_iter()
            .rev()
            .map(|k| {
                let c = CompiledKey::new(&k);
                (k, c)
            })
            .collect();
    }

    /// The credentials for `image` (a normalised repository, see [`repository`]), most
    /// specific location first; Docker Hub's entry serves Hub images nothing else matched.
    pub fn lookup(&self, image: &str) -> Vec<ImageAuth> {
        self.lookup_tracked(image)
            .into_iter()
            .map(|t| t.auth)
            .collect()
    }

    /// [`Keyring::lookup`] with each credential's hash and source.
    pub fn lookup_tracked(&self, image: &str) -> Vec<TrackedAuth> {
        let track = |(auth, hash): &(ImageAuth, String)| TrackedAuth {
            auth: auth.clone(),
            hash: hash.clone(),
            source: self.source.clone(),
            service_account: self.service_account.clone(),
        };
        let mut out = Vec::new();
        if image.len() > MAX_REPOSITORY {
            tracing::warn!(
                repository_bytes = image.len(),
                "image repository over {MAX_REPOSITORY} characters: no credentials match it"
            );
            return out;
        }
        let Some(target) = parse_location(image) else {
            return out;
        };
        for (key, compiled) in &self.index {
            if compiled.as_ref().is_some_and(|c| c.matches(&target)) {
                out.extend(self.creds[key].iter().map(track));
            }
        }
        if out.is_empty()
            && is_default_registry(image)
            && let Some(c) = self.creds.get(DEFAULT_REGISTRY_HOST)
        {
            out.extend(c.iter().map(track));
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        self.creds.is_empty()
    }

    /// How many credential locations it holds.
    pub fn len(&self) -> usize {
        self.index.len()
    }
}

/// The credentials to try for `image`, in upstream's order: each pull secret's keyring in
/// the pod's order, then the node's.
pub fn lookup_all(keyrings: &[Keyring], image: &str) -> Vec<ImageAuth> {
    lookup_all_tracked(keyrings, image)
        .into_iter()
        .map(|t| t.auth)
        .collect()
}

/// [`lookup_all`] with each credential's hash and source.
/// An image whose repository is over [`MAX_REPOSITORY`] gets none. CPU-bound (every key is
/// matched): from async code use [`lookup_all_tracked_blocking`].
pub fn lookup_all_tracked(keyrings: &[Keyring], image: &str) -> Vec<TrackedAuth> {
    let repo = repository(image);
    keyrings
        .iter()
        .flat_map(|k| k.lookup_tracked(&repo))
        .collect()
}

/// [`lookup_all_tracked`] on the blocking pool: a pod's pull secrets may hold up to the
/// apiserver's object size in keys, and the async workers serve :10250, the Lease and PLEG.
pub async fn lookup_all_tracked_blocking(keyrings: Vec<Keyring>, image: &str) -> Vec<TrackedAuth> {
    let image = image.to_string();
    tokio::task::spawn_blocking(move || lookup_all_tracked(&keyrings, &image))
        .await
        .unwrap_or_else(|e| {
            tracing::error!(error = %e, "credential lookup failed");
            Vec::new()
        })
}

/// Where the node's docker config is looked for, as upstream's DefaultDockerConfigJSONPaths
/// and DefaultDockercfgPaths: the kubelet's root dir, the working directory, `$HOME`
/// (`$HOME/.docker` for config.json) and `/` (`/.docker`). config.json wins over .dockercfg.
pub fn node_config_paths(root_dir: &Path) -> Vec<PathBuf> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let cwd = std::env::current_dir().ok();
    let mut out = Vec::new();
    let json_dirs = [
        Some(root_dir.to_path_buf()),
        cwd.clone(),
        home.as_ref().map(|h| h.join(".docker")),
        Some(PathBuf::from("/.docker")),
    ];
    out.extend(
        json_dirs
            .into_iter()
            .flatten()
            .map(|d| d.join("config.json")),
    );
    let cfg_dirs = [
        Some(root_dir.to_path_buf()),
        cwd,
        home,
        Some(PathBuf::from("/")),
    ];
    out.extend(cfg_dirs.into_iter().flatten().map(|d| d.join(".dockercfg")));
    out
}

/// The node's docker config: the first of [`node_config_paths`] that reads and parses.
/// Blocking (reads files): call from the blocking pool.
pub fn read_node_keyring(root_dir: &Path) -> Keyring {
    let mut k = Keyring::default();
    for path in node_config_paths(root_dir) {
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        let json = path.file_name().is_some_and(|n| n == "config.json");
        let parsed = if json {
            parse_config_json(&bytes)
        } else {
            parse_dockercfg(&bytes)
        };
        match parsed {
            Ok(c) => {
                tracing::debug!(path = %path.display(), "using the node's docker config");
                k.add(c);
                return k;
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "node docker config unreadable; trying the next");
            }
        }
    }
    k
}

/// Keys of a pull secret's data, as upstream's MakeDockerKeyring reads them.
pub const DOCKER_CONFIG_JSON_KEY: &str = ".dockerconfigjson";
pub const DOCKERCFG_KEY: &str = ".dockercfg";

/// A pull secret's keyring from its data: `.dockerconfigjson` (type
/// `kubernetes.io/dockerconfigjson`) or `.dockercfg` (`kubernetes.io/dockercfg`); a secret
/// with neither gives no credentials.
pub fn secret_keyring(
    data: &BTreeMap<String, Vec<u8>>,
) -> Result<Option<Keyring>, CredentialError> {
    let config = if let Some(b) = data.get(DOCKER_CONFIG_JSON_KEY).filter(|b| !b.is_empty()) {
        parse_config_json(b)?
    } else if let Some(b) = data.get(DOCKERCFG_KEY).filter(|b| !b.is_empty()) {
        parse_dockercfg(b)?
    } else {
        return Ok(None);
    };
    let mut k = Keyring::default();
    k.add(config);
    Ok(Some(k))
}

#[cfg(test)]
mod tests;
