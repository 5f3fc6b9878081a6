//! Pulled-image credential verification (upstream's image pull manager, KEP-2535, feature
//! gate `KubeletEnsureSecretPulledImages`): before each pull an intent is written, after a
//! successful one a record of the image ID with the credentials that worked (the pull
//! secret's namespace/name/UID and a hash of its credentials; or "any pod on the node" when
//! the pull needed none or used the node's own). A pod that asks for an image already present
//! must then show credentials a record lists, or pull with its own, unless the policy
//! ([`policy`]) exempts the image. Records live on disk ([`store`]) and survive restarts; an
//! intent left by a pull the agent did not see finish becomes a record without credentials
//! at start (so every pod must verify), as upstream. Image GC removes the records of images
//! gone.
//!
//! Every method here is blocking (file IO under one lock); the `*_async` twins run them on
//! the blocking pool.

pub mod format;
pub mod policy;
pub mod store;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use format::{ImagePullCredentials, ImagePulledRecord};
pub use policy::{Check, GATE, PodCredentials, Settings, VerifyPolicy};
use store::{Store, StoreError};

use crate::images::reference;
use crate::runtime::ImageSummary;

/// The records and the policy they are checked against.
pub struct PullRecords {
    store: Store,
    policy: VerifyPolicy,
    /// Pulls in flight per image (the intent file stays while one runs). The lock also
    /// serialises every read-modify-write of the records.
    intents: Mutex<HashMap<String, u32>>,
}

/// Runs `f` on the blocking pool; None if it panicked.
/// Why a pulled-image record or intent could not be written, or the records not opened.
#[derive(Debug, thiserror::Error)]
pub enum PulledRecordError {
    #[error("invalid image name {image:?}: {source}")]
    InvalidImage {
        image: String,
        source: reference::ReferenceError,
    },
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("recording the pull intent failed")]
    IntentPanicked,
    #[error("failed to setup the FSPullRecordsAccessor: {0}")]
    Open(StoreError),
    #[error("opening the image pull records panicked")]
    OpenPanicked,
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    match tokio::task::spawn_blocking(f).await {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::error!(error = %e, "image pull records: blocking task failed");
            None
        }
    }
}

impl PullRecords {
    /// The records under `<root_dir>/image_manager`, directories created (an error fails
    /// the start, as upstream's).
    pub fn open(root_dir: &Path, policy: VerifyPolicy) -> Result<Self, StoreError> {
        Ok(Self {
            store: Store::open(root_dir)?,
            policy,
            intents: Mutex::new(HashMap::new()),
        })
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, u32>> {
        self.intents.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Upstream's initialize: an intent whose image the runtime has (by one of its tags or
    /// digests) becomes a record of that image ID without credentials, and goes. Intents of
    /// images not there stay (a pod asking for such an image counts it as the kubelet's).
    pub fn initialize(&self, images: &[ImageSummary]) {
        let (intents, errors) = self.store.list_intents();
        for e in errors {
            tracing::error!(error = %e, "there were errors listing ImagePullIntents, continuing with an incomplete records list");
        }
        let in_flight: HashSet<String> = intents.into_iter().map(|i| i.image).collect();
        if in_flight.is_empty() {
            return;
        }
        let _guard = self.lock();
        for img in images {
            let found: HashSet<&String> = img
                .repo_digests
                .iter()
                .chain(&img.repo_tags)
                .filter(|n| in_flight.contains(*n))
                .collect();
            for image in found {
                if let Err(e) = self.write_if_changed(image, &img.id, None) {
                    tracing::error!(error = %e, image_ref = %img.id, "failed to write an image pull record");
                    continue;
                }
                if let Err(e) = self.store.delete_intent(image) {
                    tracing::debug!(%image, error = %e, "failed to remove image pull intent file");
                }
            }
        }
    }

    /// Before a pull of `image` (the container's `image` field).
    pub fn record_pull_intent(&self, image: &str) -> Result<(), StoreError> {
        let mut intents = self.lock();
        self.store.write_intent(image)?;
        *intents.entry(image.to_string()).or_default() += 1;
        Ok(())
    }

    /// After a successful pull of `image` as `image_ref` with `credentials`. When the
    /// record cannot be written the intent stays (the image counts as the kubelet's, and the
    /// next start turns the intent into a record).
    pub fn record_image_pulled(
        &self,
        image: &str,
        image_ref: &str,
        credentials: &ImagePullCredentials,
    ) {
        let mut intents = self.lock();
        if let Err(e) = self.write_if_changed(image, image_ref, Some(credentials)) {
            tracing::error!(error = %e, %image_ref, "failed to write image pulled record");
            return;
        }
        self.decrement(&mut intents, image);
    }

    /// After a failed pull (or one that did not start).
    pub fn record_image_pull_failed(&self, image: &str) {
        let mut intents = self.lock();
        self.decrement(&mut intents, image);
    }

    fn decrement(&self, intents: &mut HashMap<String, u32>, image: &str) {
        if intents.get(image).copied().unwrap_or(0) <= 1 {
            if let Err(e) = self.store.delete_intent(image) {
                tracing::error!(error = %e, %image, "failed to remove image pull intent");
                return;
            }
            intents.remove(image);
            return;
        }
        if let Some(n) = intents.get_mut(image) {
            *n -= 1;
        }
    }

    /// Upstream's writePulledRecordIfChanged (the lock held): `credentials` None records the
    /// image as the kubelet's with no credentials known.
    fn write_if_changed(
        &self,
        image: &str,
        image_ref: &str,
        credentials: Option<&ImagePullCredentials>,
    ) -> Result<(), PulledRecordError> {
        let key = reference::repository_name(image).map_err(|source| {
            PulledRecordError::InvalidImage {
                image: image.to_string(),
                source,
            }
        })?;
        let now = jiff::Timestamp::now();
        let existing = self.store.get_pulled(image_ref).unwrap_or_else(|e| {
            tracing::info!(%image, error = %e, "failed to retrieve an ImagePulledRecord");
            None
        });
        let record = match existing {
            None => {
                let mut r = ImagePulledRecord::new(image_ref, now);
                if let Some(c) = credentials {
                    r.credential_mapping.insert(key, c.clone());
                }
                r
            }
            Some(mut r) => {
                let changed = credentials.is_some_and(|c| format::merge(&mut r, &key, c, now));
                if !changed {
                    return Ok(());
                }
                r
            }
        };
        Ok(self.store.write_pulled(&record)?)
    }

    /// Whether a pod must pull `image`, present as `image_ref`, to use it: the policy asks
    /// for verification and no record shows the pod's credentials (`pod`) may use it. Records
    /// that cannot be read mean a pull. The error is `pod`'s (the pod's pull credentials
    /// could not be made), when a record needed them.
    pub fn must_attempt_pull<E>(
        &self,
        image: &str,
        image_ref: &str,
        pod: impl FnOnce() -> Result<PodCredentials, E>,
    ) -> Result<bool, E> {
        if image_ref.is_empty() {
            return Ok(true);
        }
        let intents = self.lock();
        let (record, pulled_by_kubelet) = match self.store.get_pulled(image_ref) {
            Ok(Some(r)) => (Some(r), true),
            Ok(None) if intents.get(image).is_some_and(|n| *n > 0) => (None, true),
            Ok(None) => match self.store.intent_exists(image) {
                Ok(exists) => (None, exists),
                Err(e) => {
                    tracing::error!(error = %e, "Unable to access cache records about image pulls");
                    return Ok(true);
                }
            },
            Err(e) => {
                tracing::error!(error = %e, "Unable to access cache records about image pulls");
                return Ok(true);
            }
        };
        match policy::check(&self.policy, image, pulled_by_kubelet, record.as_ref(), pod)? {
            Check::MustPull => Ok(true),
            Check::PolicyAllowed | Check::RecordFound { remember: None } => Ok(false),
            Check::RecordFound {
                remember: Some(secret),
            } => {
                let creds = ImagePullCredentials {
                    kubernetes_secrets: vec![secret],
                    ..Default::default()
                };
                if let Err(e) = self.write_if_changed(image, image_ref, Some(&creds)) {
                    tracing::error!(error = %e, %image, %image_ref, "failed to write an image pulled record");
                }
                Ok(false)
            }
        }
    }

    /// Upstream's PruneUnknownRecords (after image GC): records of image IDs not in
    /// `image_ids`, last updated before `until` (when the listing began), go.
    pub fn prune_unknown_records(&self, image_ids: &[String], until: jiff::Timestamp) {
        let _guard = self.lock();
        let (records, errors) = self.store.list_pulled();
        for e in errors {
            tracing::error!(error = %e, "there were errors listing ImagePulledRecords, garbage collection will proceed with incomplete records list");
        }
        let in_use: HashSet<&str> = image_ids.iter().map(String::as_str).collect();
        // Records keep whole seconds: one written in the second the listing began stays.
        let until = format::seconds(until);
        for r in records {
            if r.last_updated_time.is_some_and(|t| t >= until)
                || in_use.contains(r.image_ref.as_str())
            {
                continue;
            }
            if let Err(e) = self.store.delete_pulled(&r.image_ref) {
                tracing::error!(error = %e, image_ref = %r.image_ref, "failed to remove an ImagePulledRecord");
            }
        }
    }

    /// [`Self::initialize`] on the blocking pool.
    pub async fn initialize_async(self: &Arc<Self>, images: Vec<ImageSummary>) {
        let me = self.clone();
        blocking(move || me.initialize(&images)).await;
    }

    /// [`Self::record_pull_intent`] on the blocking pool.
    pub async fn record_pull_intent_async(
        self: &Arc<Self>,
        image: &str,
    ) -> Result<(), PulledRecordError> {
        let (me, image) = (self.clone(), image.to_string());
        blocking(move || {
            me.record_pull_intent(&image)
                .map_err(PulledRecordError::Store)
        })
        .await
        .unwrap_or(Err(PulledRecordError::IntentPanicked))
    }

    /// [`Self::record_image_pulled`] on the blocking pool.
    pub async fn record_image_pulled_async(
        self: &Arc<Self>,
        image: &str,
        image_ref: &str,
        credentials: ImagePullCredentials,
    ) {
        let (me, image, image_ref) = (self.clone(), image.to_string(), image_ref.to_string());
        blocking(move || me.record_image_pulled(&image, &image_ref, &credentials)).await;
    }

    /// [`Self::record_image_pull_failed`] on the blocking pool.
    pub async fn record_image_pull_failed_async(self: &Arc<Self>, image: &str) {
        let (me, image) = (self.clone(), image.to_string());
        blocking(move || me.record_image_pull_failed(&image)).await;
    }

    /// [`Self::must_attempt_pull`] on the blocking pool, with the pod's credentials made.
    pub async fn must_attempt_pull_async<E: Send + 'static>(
        self: &Arc<Self>,
        image: &str,
        image_ref: &str,
        pod: Result<PodCredentials, E>,
    ) -> Result<bool, E> {
        let (me, image, image_ref) = (self.clone(), image.to_string(), image_ref.to_string());
        blocking(move || me.must_attempt_pull(&image, &image_ref, move || pod))
            .await
            .unwrap_or(Ok(true))
    }

    /// [`Self::prune_unknown_records`] on the blocking pool.
    pub async fn prune_unknown_records_async(
        self: &Arc<Self>,
        image_ids: Vec<String>,
        until: jiff::Timestamp,
    ) {
        let me = self.clone();
        blocking(move || me.prune_unknown_records(&image_ids, until)).await;
    }
}

/// Opens the records under `root_dir` and, when intents are left from an earlier run, turns
/// those the runtime's images answer into records (upstream's NewImagePullManager).
pub async fn start(
    root_dir: &Path,
    policy: VerifyPolicy,
    runtime: &dyn crate::runtime::Runtime,
) -> Result<Arc<PullRecords>, PulledRecordError> {
    let root = root_dir.to_path_buf();
    let records = blocking(move || PullRecords::open(&root, policy))
        .await
        .ok_or(PulledRecordError::OpenPanicked)?
        .map_err(PulledRecordError::Open)?;
    let records = Arc::new(records);
    let pending = {
        let r = records.clone();
        blocking(move || !r.store.list_intents().0.is_empty())
            .await
            .unwrap_or(false)
    };
    if pending {
        match runtime.list_images().await {
            Ok(images) => records.initialize_async(images).await,
            Err(e) => tracing::error!(error = %e, "failed to list images"),
        }
    }
    Ok(records)
}

#[cfg(test)]
mod tests;
