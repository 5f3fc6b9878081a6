//! The kube-proxy role hosted in the kubelet process (`--proxy-config`, ours, not upstream's).
//!
//! In cluster mode the proxy shares the kubelet's apiserver client: when the client
//! certificate rotates, the role restarts on the new client (its first sync after a restart is
//! a full one, as after any kube-proxy restart). Standalone, the proxy uses its own source
//! (`clientConnection.kubeconfig`).

use crate::objects::ClientHandle;
use proxy::app::Environment;
use proxy::config::{Flags, ProxyConfig};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Why the hosted proxy role cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ProxyRoleError {
    #[error("--proxy-config {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--proxy-config {path}: {source}")]
    Config {
        path: PathBuf,
        #[source]
        source: proxy::config::Error,
    },
    #[error(
        "--proxy-config {0}: without an apiserver (standalone kubelet) the proxy role needs its own clientConnection.kubeconfig"
    )]
    NoSource(PathBuf),
}

/// Standalone, the hosted proxy has no kubelet client to share: it needs a source of its own.
pub fn check_standalone(path: &Path, cfg: &ProxyConfig) -> Result<(), ProxyRoleError> {
    if proxy::app::client_options(cfg, proxy::app::in_cluster_env()).is_none() {
        return Err(ProxyRoleError::NoSource(path.into()));
    }
    Ok(())
}

/// Reads and validates the KubeProxyConfiguration; the proxy's node is the kubelet's node.
pub fn load(path: &Path, node_name: &str) -> Result<ProxyConfig, ProxyRoleError> {
    let text = std::fs::read_to_string(path).map_err(|source| ProxyRoleError::Read {
        path: path.into(),
        source,
    })?;
    let flags = Flags {
        hostname_override: Some(node_name.into()),
        ..Flags::default()
    };
    proxy::config::resolve(&flags, Some(&text), node_name).map_err(|source| {
        ProxyRoleError::Config {
            path: path.into(),
            source,
        }
    })
}

/// How long to wait before starting the role again after it failed.
const RETRY: Duration = Duration::from_secs(5);

/// Runs the proxy role until `cancel`, on the kubelet's client when there is one.
pub async fn run(cfg: ProxyConfig, client: Option<ClientHandle>, cancel: CancellationToken) {
    let Some(mut handle) = client else {
        loop {
            match proxy::app::run(cfg.clone(), Environment::default(), cancel.clone()).await {
                Ok(()) => return,
                Err(e) => tracing::error!(error = %e, "kube-proxy role failed; retrying in 5s"),
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(RETRY) => {}
            }
        }
    };
    loop {
        handle.mark_seen();
        let token = cancel.child_token();
        let mut role = tokio::spawn(proxy::app::run_with_client(
            cfg.clone(),
            Environment::default(),
            handle.current(),
            token.clone(),
        ));
        let failed = tokio::select! {
            _ = cancel.cancelled() => {
                let _ = role.await;
                return;
            }
            _ = handle.changed() => {
                tracing::info!("apiserver client replaced (certificate rotation): restarting the kube-proxy role on it");
                token.cancel();
                let _ = role.await;
                false
            }
            r = &mut role => {
                match r {
                    Ok(Ok(())) => return,
                    Ok(Err(e)) => tracing::error!(error = %e, "kube-proxy role failed; retrying in 5s"),
                    Err(e) => tracing::error!(error = %e, "kube-proxy role panicked; retrying in 5s"),
                }
                true
            }
        };
        if failed {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(RETRY) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proxy_runs_as_the_kubelets_node() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("proxy.yaml");
        std::fs::write(
            &p,
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nhostnameOverride: other\nclusterCIDR: 10.244.0.0/16\n",
        )
        .unwrap();
        let cfg = load(&p, "node-a").unwrap();
        assert_eq!(cfg.node_name, "node-a");
    }

    #[test]
    fn bad_files_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.yaml");
        let e = load(&missing, "n").unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("--proxy-config {}", missing.display())),
            "{e}"
        );
        let p = dir.path().join("proxy.yaml");
        std::fs::write(
            &p,
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: userspace\n",
        )
        .unwrap();
        let e = load(&p, "n").unwrap_err().to_string();
        assert!(e.contains("userspace"), "{e}");
    }

    #[test]
    fn standalone_needs_a_source_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("proxy.yaml");
        std::fs::write(
            &p,
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n",
        )
        .unwrap();
        let cfg = load(&p, "n").unwrap();
        let e = check_standalone(&p, &cfg).unwrap_err().to_string();
        assert!(e.contains("clientConnection.kubeconfig"), "{e}");
        std::fs::write(
            &p,
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclientConnection:\n  kubeconfig: /etc/kubernetes/proxy.conf\n",
        )
        .unwrap();
        let cfg = load(&p, "n").unwrap();
        assert!(check_standalone(&p, &cfg).is_ok());
    }
}
