//! Images for containers: the pull policy, pulls (one at a time with `serializeImagePulls`,
//! else up to `maxParallelImagePulls`: [`pull_gate`])
//! and the per-image pull back-off, with upstream's events and waiting reasons; registry
//! credentials ([`credentials`]: pull secrets and the node's docker config); which pods may
//! use an image already present ([`pull_records`]: pulled-image credential verification);
//! image garbage collection ([`gc`]).

pub mod credentials;
pub mod gc;
pub mod pull_gate;
pub mod pull_records;
pub mod reference;
pub mod settings;
pub mod throttle;
pub use gc::{DEFAULT_SANDBOX_IMAGE, ImageGc, ImageGcPolicy};
pub use pull_gate::{PullGate, PullSettings};
pub use settings::Settings;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Container;
use tokio::time::Instant;

use crate::events::EventType;
use crate::podspec;
use crate::runtime::{ImageAuth, ImageInfo, Runtime, RuntimeError, SandboxConfig};
pub use credentials::Keyring;
pub use gc::PERIOD_ENV as IMAGE_GC_PERIOD_ENV;
use plumbing::Backoff;
pub use pull_records::{
    GATE as PULL_RECORDS_GATE, PullRecords, Settings as PullRecordsSettings,
    start as start_pull_records,
};

/// Pull back-off: 10 s doubling up to 5 min, per image (upstream's image back-off uses the
/// container back-off's period and cap).
pub const PULL_BACKOFF_INITIAL: Duration = Duration::from_secs(10);
pub const PULL_BACKOFF_MAX: Duration = Duration::from_secs(300);

/// Why a container's image is not there yet: upstream's waiting reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullReason {
    ErrImagePull,
    ImagePullBackOff,
    ErrImageNeverPull,
    ImageInspectError,
}

impl PullReason {
    pub fn as_str(self) -> &'static str {
        match self {
            PullReason::ErrImagePull => "ErrImagePull",
            PullReason::ImagePullBackOff => "ImagePullBackOff",
            PullReason::ErrImageNeverPull => "ErrImageNeverPull",
            PullReason::ImageInspectError => "ImageInspectError",
        }
    }
}

/// A container's image cannot be had (yet), and when to try again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullError {
    pub reason: PullReason,
    pub message: String,
    pub retry_after: Duration,
}

/// Image back-off state, per image: when the next pull may start, and the back-off.
#[derive(Debug, Default)]
pub struct PullBackoff {
    until: HashMap<String, (Instant, Backoff)>,
}

/// What [`ensure_image`] needs from the node.
pub struct Puller<'a> {
    pub runtime: &'a dyn Runtime,
    /// A slot of it is held while pulling (`serializeImagePulls`, `maxParallelImagePulls`).
    pub pull_gate: &'a PullGate,
    /// Records an event about the container.
    pub event: &'a (dyn Fn(EventType, &str, &str) + Send + Sync),
    /// Pull secrets' keyrings in the pod's order, then the node's.
    pub keyrings: &'a [credentials::Keyring],
    /// A pull secret whose docker config does not parse: pulls fail with this, as
    /// upstream's MakeDockerKeyring error fails them.
    pub keyring_error: Option<&'a str>,
    /// Pulled-image credential verification (None: the `KubeletEnsureSecretPulledImages`
    /// gate is off and any pod may use any image present).
    pub records: Option<&'a Arc<pull_records::PullRecords>>,
    /// The node's credential provider plugins and the pod pulling (None: no
    /// `--image-credential-provider-config`). Run only when a pull or a verification
    /// needs the credentials.
    pub plugins: Option<(
        &'a credentials::plugins::CredentialProviders,
        &'a credentials::plugins::PodIdentity,
    )>,
}

/// The keyrings for `image`: the pod's pull secrets' and the node's, then what the credential
/// provider plugins give for it (upstream's default keyring runs them per image).
async fn keyrings_for(p: &Puller<'_>, image: &str) -> Vec<credentials::Keyring> {
    let mut out = p.keyrings.to_vec();
    // A pull secret that does not parse fails the pull before any credential is used.
    if let Some((providers, pod)) = p.plugins.filter(|_| p.keyring_error.is_none()) {
        out.extend(
            providers
                .keyrings(&credentials::repository(image), pod)
                .await,
        );
    }
    out
}

/// Why a pull failed; the text goes into the `Failed` event and the waiting message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PullFailure {
    /// A pull secret's docker config does not parse (upstream's MakeDockerKeyring error):
    /// no pull is tried.
    #[error("{0}")]
    InvalidPullSecret(String),
    /// The registry bucket (`registryPullQPS`/`registryBurst`) had no token: no pull was
    /// tried (upstream's throttled image service).
    #[error("{}", throttle::QPS_EXCEEDED)]
    QpsExceeded,
    /// The runtime's pulls failed, one per credential tried in order (one anonymous pull
    /// without credentials). Shown as Go's aggregate error: one as is, several in brackets.
    #[error("{}", aggregate(.0))]
    Runtime(Vec<RuntimeError>),
}

fn aggregate(errors: &[RuntimeError]) -> String {
    match errors {
        [one] => one.to_string(),
        many => {
            let all: Vec<String> = many.iter().map(ToString::to_string).collect();
            format!("[{}]", all.join(", "))
        }
    }
}

/// Upstream's pull with a keyring: without matching credentials one anonymous pull, else
/// each matching credential in turn until one pull succeeds; every failure is reported.
/// Returns the image ID and the credential that worked (None: anonymous).
/// `creds` are the matching credentials, looked up before the pull slot was taken.
async fn pull(
    runtime: &dyn Runtime,
    image: &str,
    creds: Vec<credentials::TrackedAuth>,
    keyring_error: Option<&str>,
    sandbox: &SandboxConfig,
) -> Result<(String, Option<credentials::TrackedAuth>), PullFailure> {
    if let Some(e) = keyring_error {
        return Err(PullFailure::InvalidPullSecret(e.to_string()));
    }
    if creds.is_empty() {
        return runtime
            .pull_image(image, None, sandbox)
            .await
            .map(|r| (r, None))
            .map_err(|e| PullFailure::Runtime(vec![e]));
    }
    let mut errors = Vec::new();
    for tracked in creds {
        let auth: &ImageAuth = &tracked.auth;
        match runtime.pull_image(image, Some(auth), sandbox).await {
            Ok(r) => return Ok((r, Some(tracked))),
            Err(e) => {
                tracing::debug!(%image, username = %auth.username, error = %e, "pull with these credentials failed");
                errors.push(e);
            }
        }
    }
    Err(PullFailure::Runtime(errors))
}

/// The pod's credentials for `image` as pulled-image records name them: each pull secret
/// with credentials for it (coordinates and credential hash). The node's own credentials
/// are not the pod's. A pull secret that does not parse is the error. The keys are matched
/// on the blocking pool.
async fn pod_credentials(
    p: &Puller<'_>,
    keyrings: Vec<credentials::Keyring>,
    image: &str,
) -> Result<pull_records::PodCredentials, PullFailure> {
    if let Some(e) = p.keyring_error {
        return Err(PullFailure::InvalidPullSecret(e.to_string()));
    }
    let tracked = credentials::lookup_all_tracked_blocking(keyrings, image).await;
    // A credential provider plugin in the service-account-token mode gave the pod's service
    // account credentials for it: records made with that account's credentials are the pod's.
    let service_account = tracked.iter().find_map(|t| t.service_account.clone());
    let secrets = tracked
        .into_iter()
        .filter_map(|t| {
            let s = t.source?;
            Some(pull_records::format::ImagePullSecret {
                uid: s.uid,
                namespace: s.namespace,
                name: s.name,
                credential_hash: t.hash,
            })
        })
        .collect();
    Ok(pull_records::PodCredentials {
        secrets,
        service_account,
    })
}

/// What a successful pull records (upstream's trackedToImagePullCreds): the pull secret
/// whose credentials worked, the service account whose token got them from a credential
/// provider plugin, or any pod on the node (no credentials, or the node's own).
pub fn pulled_with(
    used: Option<&credentials::TrackedAuth>,
) -> pull_records::format::ImagePullCredentials {
    use pull_records::format::{ImagePullCredentials, ImagePullSecret};
    if let Some(sa) = used.and_then(|t| t.service_account.clone()) {
        return ImagePullCredentials {
            kubernetes_service_accounts: vec![sa],
            ..Default::default()
        };
    }
    match used.and_then(|t| t.source.as_ref().map(|s| (t, s))) {
        Some((t, s)) => ImagePullCredentials {
            kubernetes_secrets: vec![ImagePullSecret {
                uid: s.uid.clone(),
                namespace: s.namespace.clone(),
                name: s.name.clone(),
                credential_hash: t.hash.clone(),
            }],
            ..Default::default()
        },
        None => ImagePullCredentials {
            node_pods_accessible: true,
            ..Default::default()
        },
    }
}

/// Records a pull's outcome for pulled-image credential verification (when it is on).
async fn record_outcome(
    p: &Puller<'_>,
    image: &str,
    result: &Result<(String, Option<credentials::TrackedAuth>), PullFailure>,
) {
    let Some(records) = p.records else {
        return;
    };
    match result {
        Ok((image_ref, used)) => {
            records
                .record_image_pulled_async(image, image_ref, pulled_with(used.as_ref()))
                .await
        }
        Err(_) => records.record_image_pull_failed_async(image).await,
    }
}

/// Makes `c`'s image present as its pull policy says: checks the store first (upstream does,
/// and containerd's PullImage always asks the registry), honours `Never` and `IfNotPresent`,
/// pulls otherwise, and backs off per image after a failed pull. With pulled-image
/// credential verification on, an image present is used without a pull only when the policy
/// exempts it or a record shows the pod's credentials (or anyone's) pulled it; otherwise the
/// pod pulls with its own credentials (`IfNotPresent`) or fails as if the image were absent
/// (`Never`), as upstream. Gives the image's status as last read (before a pull when it was
/// present, after it otherwise), so that the caller need not ask the runtime again.
pub async fn ensure_image(
    p: &Puller<'_>,
    backoff: &mut PullBackoff,
    c: &Container,
    sandbox: &SandboxConfig,
) -> Result<Option<ImageInfo>, PullError> {
    let image = c.image.clone().unwrap_or_default();
    let policy = c
        .image_pull_policy
        .clone()
        .unwrap_or_else(|| podspec::default_pull_policy(&image).into());
    let fail = |reason: PullReason, message: String, retry_after: Duration| PullError {
        reason,
        message,
        retry_after,
    };
    let present = p.runtime.image_status(&image).await.map_err(|e| {
        fail(
            PullReason::ImageInspectError,
            format!("Failed to inspect image {image:?}: {e}"),
            Duration::from_secs(5),
        )
    })?;
    // Upstream says the same whether the image is absent or present but not the pod's to
    // use, so a pod cannot learn what other pods pulled.
    let never_pull = || {
        let message = format!("Container image {image:?} is not present with pull policy of Never");
        (p.event)(EventType::Warning, "ErrImageNeverPull", &message);
        fail(
            PullReason::ErrImageNeverPull,
            message,
            Duration::from_secs(10),
        )
    };
    let pulled_event = |message: String| (p.event)(EventType::Normal, "Pulled", &message);
    match (policy.as_str(), &present) {
        ("Never", None) => return Err(never_pull()),
        ("Never" | "IfNotPresent", Some(info)) => match p.records {
            None => {
                pulled_event(format!(
                    "Container image {image:?} already present on machine"
                ));
                return Ok(Some(info.clone()));
            }
            Some(records) => {
                let keyrings = keyrings_for(p, &image).await;
                let pod = pod_credentials(p, keyrings, &image).await;
                match records.must_attempt_pull_async(&image, &info.id, pod).await {
                    Ok(false) => {
                        pulled_event(format!(
                            "Container image {image:?} already present on machine and can be accessed by the pod"
                        ));
                        return Ok(Some(info.clone()));
                    }
                    Ok(true) if policy == "Never" => return Err(never_pull()),
                    Ok(true) => {
                        tracing::info!(%image, "image present but not verified for this pod's credentials: pulling it with them");
                    }
                    Err(e) => {
                        let (reason, retry) = (PullReason::ErrImagePull, Duration::from_secs(10));
                        return Err(fail(reason, e.to_string(), retry));
                    }
                }
            }
        },
        _ => {}
    }
    let now = Instant::now();
    if let Some((until, _)) = backoff.until.get(&image)
        && now < *until
    {
        let message = format!("Back-off pulling image {image:?}");
        (p.event)(EventType::Normal, "BackOff", &message);
        return Err(fail(PullReason::ImagePullBackOff, message, *until - now));
    }
    tracing::info!(%image, "Pulling image");
    (p.event)(
        EventType::Normal,
        "Pulling",
        &format!("Pulling image {image:?}"),
    );
    if let Some(records) = p.records
        && let Err(e) = records.record_pull_intent_async(&image).await
    {
        return Err(fail(
            PullReason::ErrImagePull,
            format!("Failed to record image pull intent for container image {image:?}: {e}"),
            Duration::from_secs(10),
        ));
    }
    let keyrings = keyrings_for(p, &image).await;
    // The credentials are matched before the pull slot is taken (a slow match must not
    // hold every other pod's pull) and on the blocking pool.
    let creds = match p.keyring_error {
        Some(_) => Vec::new(),
        None => credentials::lookup_all_tracked_blocking(keyrings, &image).await,
    };
    let waited = std::time::Instant::now();
    let guard = p.pull_gate.enter().await;
    let pulling = std::time::Instant::now();
    // An unreadable pull secret fails before the image service (and its bucket) is asked.
    let result = if p.keyring_error.is_some() || p.pull_gate.try_accept() {
        pull(p.runtime, &image, creds, p.keyring_error, sandbox).await
    } else {
        Err(PullFailure::QpsExceeded)
    };
    drop(guard);
    record_outcome(p, &image, &result).await;
    match result {
        Ok(_) => {
            backoff.until.remove(&image);
            tracing::info!(%image, "Successfully pulled image");
            let info = p.runtime.image_status(&image).await.ok().flatten();
            let size = info.as_ref().map_or(0, |i| i.size);
            // Go's Duration printing, truncated to milliseconds as upstream does.
            let ms = |d: Duration| {
                plumbing::duration::format(Duration::from_millis(d.as_millis() as u64))
            };
            let message = format!(
                "Successfully pulled image {image:?} in {} ({} including waiting). Image size: {size} bytes.",
                ms(pulling.elapsed()),
                ms(waited.elapsed()),
            );
            (p.event)(EventType::Normal, "Pulled", &message);
            Ok(info)
        }
        Err(e) => {
            let mut b = backoff.until.remove(&image).map_or_else(
                || Backoff::new(PULL_BACKOFF_INITIAL, PULL_BACKOFF_MAX),
                |(_, b)| b,
            );
            let delay = b.fail();
            backoff.until.insert(image.clone(), (now + delay, b));
            (p.event)(
                EventType::Warning,
                "Failed",
                &format!("Failed to pull image {image:?}: {e}"),
            );
            Err(fail(
                PullReason::ErrImagePull,
                format!("failed to pull image {image:?}: {e}"),
                delay,
            ))
        }
    }
}

/// The reason of the Warning event about a pull secret with keys refused for an over-long
/// host (ours: upstream has no bound).
pub const REFUSED_PULL_SECRET_KEY: &str = "RefusedImagePullSecretKey";

/// A pod's pull credentials as [`pod_keyrings`] reads them.
#[derive(Debug, Default)]
pub struct SecretKeyrings {
    /// Its pull secrets' keyrings in the pod's order, then the node's.
    pub keyrings: Vec<credentials::Keyring>,
    /// Pull secrets that could not be read (upstream warns with
    /// `FailedToRetrieveImagePullSecret` and pulls anyway).
    pub missing: Vec<String>,
    /// Pull secrets whose docker config does not parse (upstream fails the pulls).
    pub invalid: Vec<String>,
    /// Pull secrets with keys refused for an over-long host
    /// ([`credentials::MAX_KEY_HOST_LABEL`]): a message naming each, never its content.
    pub refused: Vec<String>,
}

/// A pull secret whose docker config does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pull secret {namespace}/{name}: {source}")]
pub struct PullSecretError {
    pub namespace: String,
    pub name: String,
    pub source: credentials::CredentialError,
}

/// A pull secret's keyring from its data, or the message for a docker config that does not
/// parse; `refused` gets a message when keys were refused.
fn read_pull_secret(
    namespace: &str,
    name: &str,
    data: &crate::objects::ObjectData,
    refused: &mut Vec<String>,
) -> Result<Option<credentials::Keyring>, PullSecretError> {
    let mut k = match credentials::secret_keyring(&data.binary) {
        Ok(Some(k)) => k,
        Ok(None) => return Ok(None),
        Err(source) => {
            return Err(PullSecretError {
                namespace: namespace.to_string(),
                name: name.to_string(),
                source,
            });
        }
    };
    if k.refused > 0 {
        refused.push(format!(
            "{} registry key(s) of pull secret {namespace}/{name} refused: a host label over {} characters or a host over {}",
            k.refused,
            credentials::MAX_KEY_HOST_LABEL,
            credentials::MAX_KEY_HOST
        ));
    }
    k.source = Some(credentials::SecretCoordinates {
        uid: data.uid.clone(),
        namespace: namespace.to_string(),
        name: name.to_string(),
    });
    Ok(Some(k))
}

/// The keyrings a pod's pulls use: its `imagePullSecrets` in order (read through the object
/// cache), then the node's docker config, with the secrets that could not be read, did not
/// parse or had keys refused. The docker configs (up to the apiserver's object size each)
/// are parsed on the blocking pool.
pub async fn pod_keyrings(
    pod: &k8s_openapi::api::core::v1::Pod,
    objects: &crate::objects::ObjectCache,
    root_dir: &std::path::Path,
) -> SecretKeyrings {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let refs = pod
        .spec
        .as_ref()
        .and_then(|s| s.image_pull_secrets.clone())
        .unwrap_or_default();
    let mut out = SecretKeyrings::default();
    let mut found = Vec::new();
    for r in refs {
        // Upstream skips entries without a name (validation once let them through).
        if r.name.is_empty() {
            continue;
        }
        let key = crate::objects::ObjectKey {
            kind: crate::objects::Kind::Secret,
            namespace: namespace.to_string(),
            name: r.name.clone(),
        };
        match objects.get(&key).await {
            Ok(Some(data)) => found.push((r.name, data)),
            Ok(None) => out.missing.push(r.name),
            Err(e) => {
                tracing::info!(secret = %r.name, error = %e, "Unable to retrieve pull secret, the image pull may not succeed.");
                out.missing.push(r.name);
            }
        }
    }
    let root = root_dir.to_path_buf();
    let ns = namespace.to_string();
    let parsed = tokio::task::spawn_blocking(move || {
        let mut out = SecretKeyrings::default();
        for (name, data) in &found {
            match read_pull_secret(&ns, name, data, &mut out.refused) {
                Ok(Some(k)) => out.keyrings.push(k),
                Ok(None) => {}
                Err(e) => out.invalid.push(e.to_string()),
            }
        }
        let node = credentials::read_node_keyring(&root);
        if !node.is_empty() {
            out.keyrings.push(node);
        }
        out
    })
    .await;
    match parsed {
        Ok(p) => {
            out.keyrings = p.keyrings;
            out.invalid = p.invalid;
            out.refused = p.refused;
        }
        Err(e) => tracing::warn!(error = %e, "reading the pod's pull secrets failed"),
    }
    out
}

#[cfg(test)]
mod tests;
