//! Whether a pod may use an image already on the node without pulling it (upstream's
//! KEP-2535 `ImagePullPolicyEnforcer` and `MustAttemptImagePull` decision), and the two
//! KubeletConfiguration fields that set it: `imagePullCredentialsVerificationPolicy` and
//! `preloadedImagesVerificationAllowlist`, validated with upstream's messages. Pure: the
//! records come in as arguments.

use std::collections::BTreeSet;

use serde::Serialize;

use super::format::{ImagePullSecret, ImagePullServiceAccount, ImagePulledRecord};
use crate::images::reference;

/// The feature gate (beta, on by default since 1.35).
pub const GATE: &str = "KubeletEnsureSecretPulledImages";

/// Upstream stops adding matching secrets to a record once it lists this many.
pub const WRITE_RECORD_WHILE_MATCHING_LIMIT: usize = 100;

/// `imagePullCredentialsVerificationPolicy`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub enum PolicyName {
    /// Anyone on the node may use any image present (the behaviour without the gate).
    NeverVerify,
    /// Images the kubelet did not pull (no record, no pull intent) need no verification;
    /// the kubelet's own pulls do.
    #[default]
    NeverVerifyPreloadedImages,
    /// Only images in `preloadedImagesVerificationAllowlist` need no verification.
    NeverVerifyAllowlistedImages,
    /// Every image needs verification.
    AlwaysVerify,
}

impl PolicyName {
    pub const ALL: [PolicyName; 4] = [
        PolicyName::NeverVerify,
        PolicyName::NeverVerifyPreloadedImages,
        PolicyName::NeverVerifyAllowlistedImages,
        PolicyName::AlwaysVerify,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PolicyName::NeverVerify => "NeverVerify",
            PolicyName::NeverVerifyPreloadedImages => "NeverVerifyPreloadedImages",
            PolicyName::NeverVerifyAllowlistedImages => "NeverVerifyAllowlistedImages",
            PolicyName::AlwaysVerify => "AlwaysVerify",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == s)
    }
}

/// Why an allowlist pattern is refused (upstream's messages).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllowlistError {
    #[error("leading/trailing spaces are not allowed: {0}")]
    Spaces(String),
    #[error("the supplied pattern is too short: {0}")]
    TooShort(String),
    #[error("not a valid wildcard pattern, only patterns ending with '/*' are allowed: {0}")]
    BadWildcard(String),
    #[error("at least registry hostname is required")]
    NoHost,
    #[error("failed to parse as an image name: {0}")]
    Name(reference::ReferenceError),
    #[error("neither tag nor digest is accepted in an image reference: {0}")]
    TagOrDigest(String),
}

/// Upstream's `getAllowlistImagePattern`: the normalised pattern and whether it is a
/// `registry/path/*` prefix; an error in upstream's words.
pub fn allowlist_pattern(pattern: &str) -> Result<(String, bool), AllowlistError> {
    if pattern != pattern.trim() {
        return Err(AllowlistError::Spaces(pattern.to_string()));
    }
    let wildcard = pattern.ends_with("/*");
    let trimmed = if wildcard {
        &pattern[..pattern.len() - 1]
    } else {
        pattern
    };
    if trimmed.is_empty() {
        return Err(AllowlistError::TooShort(pattern.to_string()));
    }
    if trimmed.contains('*') {
        return Err(AllowlistError::BadWildcard(pattern.to_string()));
    }
    if wildcard {
        if trimmed.len() == 1 {
            return Err(AllowlistError::NoHost);
        }
        return Ok((trimmed.to_string(), true));
    }
    let named = reference::parse_normalized_named(trimmed).map_err(AllowlistError::Name)?;
    if named.name != trimmed {
        return Err(AllowlistError::TagOrDigest(pattern.to_string()));
    }
    Ok((trimmed.to_string(), false))
}

/// `preloadedImagesVerificationAllowlist`, compiled: exact image names and `prefix/` paths.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist {
    exact: BTreeSet<String>,
    prefixes: Vec<String>,
}

impl Allowlist {
    pub fn new(patterns: &[String]) -> Result<Self, AllowlistError> {
        let mut out = Allowlist::default();
        for p in patterns {
            match allowlist_pattern(p)? {
                (prefix, true) => out.prefixes.push(prefix),
                (name, false) => {
                    out.exact.insert(name);
                }
            }
        }
        Ok(out)
    }

    /// The image's normalised name (`nginx:1` is `docker.io/library/nginx`) is listed or
    /// under a listed prefix; an image that does not parse matches nothing.
    pub fn matches(&self, image: &str) -> bool {
        let Ok(name) = reference::repository_name(image) else {
            tracing::error!(%image, "failed to parse image name");
            return false;
        };
        self.exact.contains(&name) || self.prefixes.iter().any(|p| name.starts_with(p.as_str()))
    }
}

/// The policy with its allowlist (upstream's `ImagePullPolicyEnforcer`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyPolicy {
    pub name: PolicyName,
    pub allowlist: Allowlist,
}

impl VerifyPolicy {
    /// Whether a pod asking for `image` must show credentials that pulled it.
    /// `pulled_by_kubelet`: a pulled record or a pull intent exists for it.
    pub fn requires_verification(&self, image: &str, pulled_by_kubelet: bool) -> bool {
        match self.name {
            PolicyName::NeverVerify => false,
            PolicyName::NeverVerifyPreloadedImages => pulled_by_kubelet,
            PolicyName::NeverVerifyAllowlistedImages => !self.allowlist.matches(image),
            PolicyName::AlwaysVerify => true,
        }
    }
}

/// The settings, validated (see [`Settings::parse`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    /// The `KubeletEnsureSecretPulledImages` gate: off, nothing is recorded or verified.
    #[serde(skip)]
    pub enabled: bool,
    /// None with the gate off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_pull_credentials_verification_policy: Option<PolicyName>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub preloaded_images_verification_allowlist: Vec<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            enabled: true,
            image_pull_credentials_verification_policy: Some(PolicyName::default()),
            preloaded_images_verification_allowlist: Vec::new(),
        }
    }
}

impl Settings {
    /// Upstream's defaulting and validation: with the gate on, an empty policy is
    /// `NeverVerifyPreloadedImages`, an allowlist needs `NeverVerifyAllowlistedImages` and
    /// its patterns must be valid; with it off, neither field may be set. `policy` and
    /// `allowlist` are the file's raw values (null is unset). The error is upstream's
    /// message after its `invalid configuration: ` prefix.
    pub fn parse(
        enabled: bool,
        policy: Option<&serde_json::Value>,
        allowlist: Option<&serde_json::Value>,
    ) -> Result<Self, String> {
        let policy = match policy {
            None | Some(serde_json::Value::Null) => String::new(),
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(v) => {
                return Err(format!(
                    "imagePullCredentialsVerificationPolicy: {v} is not a string"
                ));
            }
        };
        let allowlist: Vec<String> = match allowlist {
            None | Some(serde_json::Value::Null) => Vec::new(),
            Some(v) => serde_json::from_value(v.clone()).map_err(|_| {
                format!("preloadedImagesVerificationAllowlist: {v} is not a list of strings")
            })?,
        };
        if !enabled {
            if !policy.is_empty() {
                return Err(format!(
                    "`imagePullCredentialsVerificationPolicy` must not be set if {GATE} feature gate is not enabled"
                ));
            }
            if !allowlist.is_empty() {
                return Err(format!(
                    "`preloadedImagesVerificationAllowlist` must not be set if {GATE} feature gate is not enabled"
                ));
            }
            return Ok(Settings {
                enabled,
                image_pull_credentials_verification_policy: None,
                preloaded_images_verification_allowlist: allowlist,
            });
        }
        let name = if policy.is_empty() {
            PolicyName::default()
        } else {
            PolicyName::parse(&policy).ok_or_else(|| {
                let [a, b, c, d] = PolicyName::ALL.map(PolicyName::as_str);
                format!(
                    "option {policy:?} specified for imagePullCredentialsVerificationPolicy. Valid options are {a:?}, {b:?}, {c:?} or {d:?}"
                )
            })?
        };
        if !allowlist.is_empty() && name != PolicyName::NeverVerifyAllowlistedImages {
            // Upstream's message, its typo included.
            return Err("can't set `preloadedImagesVerificationAllowlist` if `imagePullCredentialsVertificationPolicy` is not \"NeverVerifyAllowlistedImages\"".into());
        }
        Allowlist::new(&allowlist).map_err(|e| {
            format!("invalid image pattern in `preloadedImagesVerificationAllowlist`: {e}")
        })?;
        Ok(Settings {
            enabled,
            image_pull_credentials_verification_policy: Some(name),
            preloaded_images_verification_allowlist: allowlist,
        })
    }

    /// The policy to enforce; None with the gate off.
    pub fn verify_policy(&self) -> Option<VerifyPolicy> {
        let name = self.image_pull_credentials_verification_policy?;
        if !self.enabled {
            return None;
        }
        Some(VerifyPolicy {
            name,
            // Validated in parse.
            allowlist: Allowlist::new(&self.preloaded_images_verification_allowlist)
                .unwrap_or_default(),
        })
    }
}

/// What the pod presents for an image: its pull secrets that have credentials for it (with
/// their hashes) and the service account a credential provider used (none here).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodCredentials {
    pub secrets: Vec<ImagePullSecret>,
    pub service_account: Option<ImagePullServiceAccount>,
}

/// The outcome of [`check`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// The policy does not ask for verification.
    PolicyAllowed,
    /// A record shows the pod's credentials (or anyone on the node) may use the image.
    /// `remember`: a pod secret to add to the record (same credentials in another secret,
    /// or a secret whose content changed), as upstream does while matching.
    RecordFound { remember: Option<ImagePullSecret> },
    /// The pod must pull the image with its own credentials.
    MustPull,
}

/// Upstream's `MustAttemptImagePull` for an image present as `record` says (None: no
/// record of the image ID). `pod` is asked for the pod's credentials only when a record
/// lists secrets or service accounts; its error is the pull's error.
pub fn check<E>(
    policy: &VerifyPolicy,
    image: &str,
    pulled_by_kubelet: bool,
    record: Option<&ImagePulledRecord>,
    pod: impl FnOnce() -> Result<PodCredentials, E>,
) -> Result<Check, E> {
    if !policy.requires_verification(image, pulled_by_kubelet) {
        return Ok(Check::PolicyAllowed);
    }
    let Some(record) = record else {
        return Ok(Check::MustPull);
    };
    let Ok(key) = reference::repository_name(image) else {
        tracing::error!(%image, "failed to parse image name, forcing image credentials reverification");
        return Ok(Check::MustPull);
    };
    let Some(cached) = record.credential_mapping.get(&key) else {
        return Ok(Check::MustPull);
    };
    if cached.node_pods_accessible {
        return Ok(Check::RecordFound { remember: None });
    }
    if cached.kubernetes_secrets.is_empty() && cached.kubernetes_service_accounts.is_empty() {
        return Ok(Check::MustPull);
    }
    let pod = pod()?;
    let room = cached.kubernetes_secrets.len() < WRITE_RECORD_WHILE_MATCHING_LIMIT;
    for have in &pod.secrets {
        for known in &cached.kubernetes_secrets {
            let hashes_match =
                !known.credential_hash.is_empty() && have.credential_hash == known.credential_hash;
            let coordinates_match = have.uid == known.uid
                && have.namespace == known.namespace
                && have.name == known.name;
            if hashes_match {
                let remember = (!coordinates_match && room).then(|| have.clone());
                return Ok(Check::RecordFound { remember });
            }
            // The same secret with new content: upstream takes it (and records the new
            // hash) while the record has room.
            if coordinates_match && room {
                return Ok(Check::RecordFound {
                    remember: Some(have.clone()),
                });
            }
        }
    }
    if let Some(sa) = &pod.service_account
        && cached.kubernetes_service_accounts.contains(sa)
    {
        return Ok(Check::RecordFound { remember: None });
    }
    Ok(Check::MustPull)
}

#[cfg(test)]
mod tests;
