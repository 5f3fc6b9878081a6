//! `--image-credential-provider-config`: a CredentialProviderConfig
//! (`kubelet.config.k8s.io/v1`, `v1beta1` or `v1alpha1`) file, or a directory whose `*.json`,
//! `*.yaml` and `*.yml` files are read in lexical order and their providers joined, as
//! upstream reads it. Decoding is strict (a field upstream does not have is an error, as
//! upstream's strict codec) and the result is validated with upstream's rules and messages.
//! Every error names the file it comes from.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use plumbing::duration;
use serde::Deserialize;

/// The exec protocol versions a provider may speak (upstream's `apiVersions`).
pub const PLUGIN_API_VERSIONS: &[&str] = &[
    "credentialprovider.kubelet.k8s.io/v1",
    "credentialprovider.kubelet.k8s.io/v1alpha1",
    "credentialprovider.kubelet.k8s.io/v1beta1",
];

/// The version `tokenAttributes` needs.
pub const TOKEN_API_VERSION: &str = "credentialprovider.kubelet.k8s.io/v1";

/// `tokenAttributes.cacheType` values (upstream's ServiceAccountTokenCacheType).
pub const CACHE_TYPES: &[&str] = &["ServiceAccount", "Token"];

const CONFIG_API_VERSIONS: &[&str] = &[
    "kubelet.config.k8s.io/v1",
    "kubelet.config.k8s.io/v1beta1",
    "kubelet.config.k8s.io/v1alpha1",
];

/// Why the credential provider configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("unable to access path {path:?}: {source}")]
    Access {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no configuration files found in directory {0:?}")]
    Empty(PathBuf),
    #[error("unable to read file {path:?}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("error decoding config {path:?}: {message}")]
    Decode { path: PathBuf, message: String },
    #[error("duplicate provider name {name:?} found in configuration file(s) ({path:?})")]
    Duplicate { name: String, path: PathBuf },
    #[error("failed to validate credential provider config {path:?}: {}", aggregate(.errors))]
    Invalid { path: PathBuf, errors: Vec<String> },
    #[error("plugin binary directory {0} did not exist")]
    NoBinDir(PathBuf),
    #[error("error inspecting binary directory {path}: {source}")]
    BinDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("plugin binary executable {0} did not exist")]
    NoBinary(PathBuf),
    #[error("error inspecting binary executable {path}: {message}")]
    Binary { path: PathBuf, message: String },
}

/// Go's aggregate error text: one as is, several in brackets.
fn aggregate(errors: &[String]) -> String {
    match errors {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    }
}

/// One `env` entry of a provider.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecEnvVar {
    pub name: String,
    pub value: String,
}

/// `tokenAttributes`: the service-account-token mode.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TokenAttributes {
    pub service_account_token_audience: String,
    pub cache_type: String,
    pub require_service_account: Option<bool>,
    pub required_service_account_annotation_keys: Vec<String>,
    pub optional_service_account_annotation_keys: Vec<String>,
}

/// One entry of `providers`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ProviderConfig {
    pub name: String,
    pub match_images: Vec<String>,
    #[serde(with = "duration::serde_opt")]
    pub default_cache_duration: Option<Duration>,
    pub api_version: String,
    pub args: Vec<String>,
    pub env: Vec<ExecEnvVar>,
    pub token_attributes: Option<TokenAttributes>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileConfig {
    kind: Option<String>,
    api_version: Option<String>,
    #[serde(default)]
    providers: Vec<ProviderConfig>,
}

/// A provider with the file it was read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourcedProvider {
    pub config: ProviderConfig,
    pub file: PathBuf,
}

/// Decodes one file's text (YAML or JSON).
pub fn decode(path: &Path, text: &str) -> Result<Vec<ProviderConfig>, ConfigError> {
    let fail = |message: String| ConfigError::Decode {
        path: path.to_path_buf(),
        message,
    };
    let opts = serde_saphyr::options! { legacy_octal_numbers: true };
    let file: FileConfig =
        serde_saphyr::from_str_with_options(text, opts).map_err(|e| fail(e.to_string()))?;
    match file.kind.as_deref() {
        Some("CredentialProviderConfig") => {}
        Some(other) => return Err(fail(format!("failed to decode {other:?} (wrong Kind)"))),
        None => return Err(fail("Object 'Kind' is missing".into())),
    }
    match file.api_version.as_deref() {
        Some(v) if CONFIG_API_VERSIONS.contains(&v) => {}
        Some(v) => {
            return Err(fail(format!(
                "failed to decode CredentialProviderConfig, unexpected apiVersion: {v}"
            )));
        }
        None => return Err(fail("Object 'apiVersion' is missing".into())),
    }
    Ok(file.providers)
}

/// Reads `path`: one file, or every `*.json`/`*.yaml`/`*.yml` file of a directory in
/// lexical order. A provider name seen twice is an error. Blocking: call from the blocking
/// pool.
pub fn read(path: &Path) -> Result<Vec<SourcedProvider>, ConfigError> {
    let meta = std::fs::metadata(path).map_err(|source| ConfigError::Access {
        path: path.to_path_buf(),
        source,
    })?;
    let files = if meta.is_dir() {
        let entries = std::fs::read_dir(path).map_err(|source| ConfigError::Access {
            path: path.to_path_buf(),
            source,
        })?;
        let mut files: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| !t.is_dir()))
            .map(|e| e.path())
            .filter(|p| {
                p.extension()
                    .is_some_and(|x| x == "json" || x == "yaml" || x == "yml")
            })
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(ConfigError::Empty(path.to_path_buf()));
        }
        files
    } else {
        vec![path.to_path_buf()]
    };
    let mut out = Vec::new();
    let mut names = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(&file).map_err(|source| ConfigError::Read {
            path: file.clone(),
            source,
        })?;
        for config in decode(&file, &text)? {
            if !names.insert(config.name.clone()) {
                return Err(ConfigError::Duplicate {
                    name: config.name,
                    path: file,
                });
            }
            out.push(SourcedProvider {
                config,
                file: file.clone(),
            });
        }
    }
    Ok(out)
}

/// Go's `%q` of a string, near enough for field errors.
fn q(s: &str) -> String {
    format!("{s:?}")
}

fn supported(values: &[&str]) -> String {
    let mut v: Vec<&str> = values.to_vec();
    v.sort();
    v.iter().map(|s| q(s)).collect::<Vec<_>>().join(", ")
}

/// Upstream's IsQualifiedName on a lower-cased annotation key: an optional DNS-subdomain
/// prefix and `/`, then a name of at most 63 alphanumerics, `-`, `_`, `.`, starting and
/// ending alphanumeric.
fn qualified_name_problem(key: &str) -> Option<String> {
    let key = key.to_lowercase();
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key.as_str()),
    };
    if name.contains('/') {
        return Some("a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')".into());
    }
    if let Some(p) = prefix {
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if p.is_empty() {
            return Some("prefix part must be non-empty".into());
        }
        if p.len() > 253 || !p.split('.').all(label_ok) {
            return Some("prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')".into());
        }
    }
    if name.is_empty() {
        return Some("name part must be non-empty".into());
    }
    if name.len() > 63 {
        return Some("name part must be no more than 63 characters".into());
    }
    let edge_ok = |c: char| c.is_ascii_alphanumeric();
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        || !name.chars().next().is_some_and(edge_ok)
        || !name.chars().last().is_some_and(edge_ok)
    {
        return Some("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')".into());
    }
    None
}

fn annotation_key_errors(field: &str, keys: &[String], out: &mut Vec<String>) {
    let mut seen = BTreeSet::new();
    for k in keys {
        if let Some(msg) = qualified_name_problem(k) {
            out.push(format!("{field}: Invalid value: {}: {msg}", q(k)));
        }
        if !seen.insert(k) {
            out.push(format!("{field}: Duplicate value: {}", q(k)));
        }
    }
}

/// Upstream's validateCredentialProviderConfig, field errors in its words, in its order.
pub fn validate(providers: &[ProviderConfig]) -> Vec<String> {
    let mut errs = Vec::new();
    if providers.is_empty() {
        errs.push("providers: Required value: at least 1 item in plugins is required".into());
    }
    let mut seen = BTreeSet::new();
    for p in providers {
        let name = &p.name;
        if name.contains('/') {
            errs.push(format!(
                "providers.name: Invalid value: {}: provider name cannot contain '/'",
                q(name)
            ));
        }
        if name.contains(' ') {
            errs.push(format!(
                "providers.name: Invalid value: {}: provider name cannot contain spaces",
                q(name)
            ));
        }
        if name == "." {
            errs.push("providers.name: Invalid value: \".\": provider name cannot be '.'".into());
        }
        if name == ".." {
            errs.push("providers.name: Invalid value: \"..\": provider name cannot be '..'".into());
        }
        // Not upstream's: an empty name would run the bin dir itself.
        if name.is_empty() {
            errs.push("providers.name: Required value".into());
        }
        if !seen.insert(name.clone()) {
            errs.push(format!("providers.name: Duplicate value: {}", q(name)));
        }
        if p.api_version.is_empty() {
            errs.push("providers.apiVersion: Required value".into());
        } else if !PLUGIN_API_VERSIONS.contains(&p.api_version.as_str()) {
            errs.push(format!(
                "providers.apiVersion: Unsupported value: {}: supported values: {}",
                q(&p.api_version),
                supported(PLUGIN_API_VERSIONS)
            ));
        }
        if p.match_images.is_empty() {
            errs.push(
                "providers.matchImages: Required value: at least 1 item in matchImages is required"
                    .into(),
            );
        }
        for m in &p.match_images {
            if super::super::parse_location(m).is_none() {
                errs.push(format!(
                    "providers.matchImages: Invalid value: {}: match image is invalid: not a registry location",
                    q(m)
                ));
            }
        }
        if p.default_cache_duration.is_none() {
            errs.push("providers.defaultCacheDuration: Required value".into());
        }
        if let Some(t) = &p.token_attributes {
            let f = "providers.tokenAttributes";
            if t.service_account_token_audience.is_empty() {
                errs.push(format!("{f}.serviceAccountTokenAudience: Required value"));
            }
            if t.require_service_account.is_none() {
                errs.push(format!("{f}.requireServiceAccount: Required value"));
            }
            if p.api_version != TOKEN_API_VERSION {
                errs.push(format!(
                    "{f}: Forbidden: tokenAttributes is only supported for {TOKEN_API_VERSION} API version"
                ));
            }
            if t.require_service_account == Some(false)
                && !t.required_service_account_annotation_keys.is_empty()
            {
                errs.push(format!("{f}.requiredServiceAccountAnnotationKeys: Forbidden: requireServiceAccount cannot be false when requiredServiceAccountAnnotationKeys is set"));
            }
            annotation_key_errors(
                &format!("{f}.requiredServiceAccountAnnotationKeys"),
                &t.required_service_account_annotation_keys,
                &mut errs,
            );
            annotation_key_errors(
                &format!("{f}.optionalServiceAccountAnnotationKeys"),
                &t.optional_service_account_annotation_keys,
                &mut errs,
            );
            let required: BTreeSet<&String> =
                t.required_service_account_annotation_keys.iter().collect();
            let both: Vec<String> = t
                .optional_service_account_annotation_keys
                .iter()
                .filter(|k| required.contains(k))
                .map(|k| q(k))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            if !both.is_empty() {
                errs.push(format!(
                    "{f}: Invalid value: []string{{{}}}: annotation keys cannot be both required and optional",
                    both.join(", ")
                ));
            }
            if t.cache_type.is_empty() {
                errs.push(format!("{f}.cacheType: Required value: cacheType is required to be set when tokenAttributes is specified. Supported values are: {}", CACHE_TYPES.join(", ")));
            } else if !CACHE_TYPES.contains(&t.cache_type.as_str()) {
                errs.push(format!(
                    "{f}.cacheType: Unsupported value: {}: supported values: {}",
                    q(&t.cache_type),
                    supported(CACHE_TYPES)
                ));
            }
        }
    }
    errs
}

/// Reads and validates the configuration and checks that the bin dir and each provider's
/// executable exist, as upstream's RegisterCredentialProviderPlugins. Blocking.
pub fn load(config: &Path, bin_dir: &Path) -> Result<Vec<SourcedProvider>, ConfigError> {
    match std::fs::metadata(bin_dir) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ConfigError::NoBinDir(bin_dir.to_path_buf()));
        }
        Err(source) => {
            return Err(ConfigError::BinDir {
                path: bin_dir.to_path_buf(),
                source,
            });
        }
    }
    let providers = read(config)?;
    let plain: Vec<ProviderConfig> = providers.iter().map(|p| p.config.clone()).collect();
    let errors = validate(&plain);
    if !errors.is_empty() {
        return Err(ConfigError::Invalid {
            path: config.to_path_buf(),
            errors,
        });
    }
    for p in &providers {
        let bin = bin_dir.join(&p.config.name);
        match std::fs::metadata(&bin) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ConfigError::NoBinary(bin));
            }
            Err(e) => {
                return Err(ConfigError::Binary {
                    path: bin,
                    message: e.to_string(),
                });
            }
            Ok(m) => {
                use std::os::unix::fs::PermissionsExt;
                if m.is_dir() || m.permissions().mode() & 0o111 == 0 {
                    return Err(ConfigError::Binary {
                        path: bin,
                        message: "permission denied".into(),
                    });
                }
            }
        }
    }
    Ok(providers)
}

#[cfg(test)]
mod tests;
