//! A source of Services and EndpointSlices that is not an apiserver: a directory of YAML/JSON
//! files (`--static-services-dir`, ours, not upstream's). Each file may hold several
//! documents (`---`) and `List` kinds; other kinds are ignored. The directory is re-read
//! periodically and diffed against what was delivered before, so editing, adding or removing
//! files updates the proxy like watch events would.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use thiserror::Error;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::tracker::ProxyHandles;

#[derive(Debug, Error)]
pub enum Error {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing {path}: {message}")]
    Parse { path: PathBuf, message: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

type Key = (String, String);

/// Objects found in one read of the directory, keyed by namespace/name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Objects {
    pub services: BTreeMap<Key, Service>,
    pub slices: BTreeMap<Key, EndpointSlice>,
}

fn collect(value: serde_json::Value, path: &Path, out: &mut Objects) -> Result<()> {
    let parse_err = |e: serde_json::Error| Error::Parse {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let kind = value.get("kind").and_then(|k| k.as_str()).unwrap_or("");
    let key = |meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        (
            meta.namespace.clone().unwrap_or_else(|| "default".into()),
            meta.name.clone().unwrap_or_default(),
        )
    };
    match kind {
        "List" | "ServiceList" | "EndpointSliceList" => {
            if let Some(items) = value.get("items").and_then(|i| i.as_array()) {
                for item in items {
                    collect(item.clone(), path, out)?;
                }
            }
        }
        "Service" => {
            let mut s: Service = serde_json::from_value(value).map_err(parse_err)?;
            let k = key(&s.metadata);
            s.metadata.namespace = Some(k.0.clone());
            out.services.insert(k, s);
        }
        "EndpointSlice" => {
            let mut s: EndpointSlice = serde_json::from_value(value).map_err(parse_err)?;
            let k = key(&s.metadata);
            s.metadata.namespace = Some(k.0.clone());
            out.slices.insert(k, s);
        }
        _ => {}
    }
    Ok(())
}

/// Parses one file's text (YAML or JSON, one or more documents).
pub fn parse_text(text: &str, path: &Path, out: &mut Objects) -> Result<()> {
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple_with_options(
        text,
        serde_saphyr::options! { legacy_octal_numbers: true },
    )
    .map_err(|e| Error::Parse {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    for d in docs.into_iter().filter(|d| !d.is_null()) {
        collect(d, path, out)?;
    }
    Ok(())
}

/// Reads every `*.yaml`, `*.yml` and `*.json` file of `dir` (not recursive).
pub fn load_dir(dir: &Path) -> Result<Objects> {
    let rd = std::fs::read_dir(dir).map_err(|source| Error::Read {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut files: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml" | "json")
            )
        })
        .collect();
    files.sort();
    let mut out = Objects::default();
    for f in files {
        let text = std::fs::read_to_string(&f).map_err(|source| Error::Read {
            path: f.clone(),
            source,
        })?;
        parse_text(&text, &f, &mut out)?;
    }
    Ok(out)
}

/// Delivers the difference between `old` and `new` to `handle`; returns the number of events.
pub fn apply_diff(handle: &ProxyHandles, old: &Objects, new: &Objects) -> usize {
    let mut n = 0;
    for (k, s) in &old.slices {
        if !new.slices.contains_key(k) {
            handle.on_endpoint_slice_delete(s);
            n += 1;
        }
    }
    for (k, s) in &old.services {
        if !new.services.contains_key(k) {
            handle.on_service_delete(s);
            n += 1;
        }
    }
    for (k, s) in &new.services {
        if old.services.get(k) != Some(s) {
            handle.on_service_upsert(s);
            n += 1;
        }
    }
    for (k, s) in &new.slices {
        if old.slices.get(k) != Some(s) {
            handle.on_endpoint_slice_upsert(s);
            n += 1;
        }
    }
    n
}

/// Re-reads `dir` every `interval` until `shutdown`. The first successful read marks both
/// initial lists as synced. A read that fails keeps the previous state.
pub async fn run_static_dir(
    dir: PathBuf,
    handle: ProxyHandles,
    interval: Duration,
    shutdown: CancellationToken,
) {
    let mut current = Objects::default();
    let mut synced = false;
    loop {
        match load_dir(&dir) {
            Ok(new) => {
                let events = apply_diff(&handle, &current, &new);
                if events > 0 {
                    info!(
                        dir = %dir.display(),
                        events,
                        services = new.services.len(),
                        slices = new.slices.len(),
                        "static services changed"
                    );
                }
                current = new;
                if !synced {
                    handle.on_services_synced();
                    handle.on_endpoint_slices_synced();
                    synced = true;
                }
            }
            Err(e) => warn!(error = %e, "static services dir not read; keeping previous state"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{IpFamily, ServiceState};
    use crate::tracker::ProxyHandle;

    const FILE: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, protocol: TCP}]
---
apiVersion: v1
kind: List
items:
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata:
    name: web-1
    labels: {kubernetes.io/service-name: web}
  addressType: IPv4
  endpoints: [{addresses: [10.244.1.2]}]
  ports: [{name: http, port: 8080, protocol: TCP}]
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: ignored}
"#;

    #[test]
    fn reads_documents_lists_and_diffs() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), FILE).unwrap();
        std::fs::write(dir.path().join("notes.txt"), "not yaml: [").unwrap();
        let objs = load_dir(dir.path()).unwrap();
        assert_eq!(objs.services.len(), 1);
        assert_eq!(objs.slices.len(), 1);
        assert!(
            objs.services
                .contains_key(&("default".into(), "web".into()))
        );

        let handle = ProxyHandle::new(ServiceState::new(IpFamily::V4, "n"));
        let handles = ProxyHandles::from(handle.clone());
        assert_eq!(apply_diff(&handles, &Objects::default(), &objs), 2);
        assert_eq!(handle.with_state(|s| s.endpoints_map().len()), 1);
        assert_eq!(apply_diff(&handles, &objs, &objs), 0);
        assert_eq!(apply_diff(&handles, &objs, &Objects::default()), 2);
        assert_eq!(handle.with_state(|s| s.service_port_map().len()), 0);

        std::fs::write(
            dir.path().join("b.json"),
            "{\"kind\": \"Service\", \"spec\": [",
        )
        .unwrap();
        assert!(matches!(load_dir(dir.path()), Err(Error::Parse { .. })));
    }
}
