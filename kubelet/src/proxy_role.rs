//! The kube-proxy role hosted in the kubelet process (`--proxy-config`, ours, not upstream's).
//!
//! The role takes its own credentials when its KubeProxyConfiguration names them
//! (`clientConnection.kubeconfig`, or `--master` style `master`), as k3s's embedded proxy
//! does: on a kubeadm cluster that is the `kube-system/kube-proxy` ServiceAccount, which
//! `kubeadm:node-proxier` binds to `system:node-proxier`. Without them it shares the kubelet's
//! client, and says at start that it runs as the node: the Node authorizer gives a node no
//! list/watch on EndpointSlices, so that identity needs `system:node-proxier` bound to it. On
//! the shared client, when the client certificate rotates, the role restarts on the new client
//! (its first sync after a restart is a full one, as after any kube-proxy restart). Standalone,
//! the proxy needs its own source.
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
    let cfg = proxy::config::resolve(&flags, Some(&text), node_name).map_err(|source| {
        ProxyRoleError::Config {
            path: path.into(),
            source,
        }
    })?;
    if let Some(msg) = hosted_logging_warning(path, &cfg) {
        tracing::warn!("{msg}");
    }
    Ok(cfg)
}

/// The hosted role writes through the kubelet's logger, so the `logging` of its
/// KubeProxyConfiguration has no effect: said by name at start rather than ignored.
fn hosted_logging_warning(path: &Path, cfg: &ProxyConfig) -> Option<String> {
    (cfg.logging != plumbing::logging::Options::default()).then(|| {
        format!(
            "--proxy-config {}: logging (format, verbosity, vmodule, options) is not used by the hosted proxy role; it logs through the kubelet's logger, set logging in the KubeletConfiguration instead",
            path.display()
        )
    })
}

/// How long to wait before starting the role again after it failed.
const RETRY: Duration = Duration::from_secs(5);

/// Whose credentials the role uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// Its own `clientConnection.kubeconfig` (or `master`): its own client.
    Own(String),
    /// The kubelet's client, i.e. the node's identity.
    Node(String),
    /// No apiserver client: the proxy's own source (static services) or none.
    Standalone,
}

/// Which credentials the role runs with: its own when the configuration names an apiserver,
/// else the kubelet's when there is a kubelet client.
pub fn identity(cfg: &ProxyConfig, has_kubelet_client: bool) -> Identity {
    if let Some(o) = proxy::app::client_options(cfg, false) {
        let what = match (&o.kubeconfig, &o.master) {
            (Some(k), _) => format!("clientConnection.kubeconfig {}", k.display()),
            (None, Some(m)) => format!("master {m}"),
            (None, None) => String::from("its own apiserver settings"),
        };
        return Identity::Own(what);
    }
    if has_kubelet_client {
        Identity::Node(format!("system:node:{}", cfg.node_name))
    } else {
        Identity::Standalone
    }
}

/// The line the role logs at start: (is a warning, text).
pub fn identity_message(id: &Identity) -> (bool, String) {
    match id {
        Identity::Own(what) => (
            false,
            format!(
                "kube-proxy role: using its own credentials from {what}; that identity needs list/watch on services, endpointslices and servicecidrs and get/list/watch on nodes (the system:node-proxier ClusterRole, which kubeadm binds to kube-system/kube-proxy)"
            ),
        ),
        Identity::Node(user) => (
            true,
            format!(
                "kube-proxy role: no clientConnection.kubeconfig in --proxy-config, so it runs with the kubelet's credentials ({user} in system:nodes); the Node authorizer gives a node no list/watch on EndpointSlices or ServiceCIDRs, so Services stay unprogrammed unless system:node-proxier is bound to this node; give the role its own kubeconfig (kubeadm's kube-system/kube-proxy ServiceAccount) instead"
            ),
        ),
        Identity::Standalone => (
            false,
            String::from("kube-proxy role: no apiserver client; using the proxy's own source"),
        ),
    }
}

/// Runs the proxy role until `cancel`: on its own credentials when configured, else on the
/// kubelet's client when there is one.
pub async fn run(cfg: ProxyConfig, client: Option<ClientHandle>, cancel: CancellationToken) {
    let id = identity(&cfg, client.is_some());
    match identity_message(&id) {
        (true, msg) => tracing::warn!(identity = ?id, "{msg}"),
        (false, msg) => tracing::info!(identity = ?id, "{msg}"),
    }
    match (id, client) {
        (Identity::Node(_), Some(handle)) => run_shared(cfg, handle, cancel).await,
        _ => run_own(cfg, cancel).await,
    }
}

/// The role on its own source (its kubeconfig, or static services), restarted after failures.
async fn run_own(cfg: ProxyConfig, cancel: CancellationToken) {
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
}

/// The role on the kubelet's client, restarted when the client is replaced.
async fn run_shared(cfg: ProxyConfig, mut handle: ClientHandle, cancel: CancellationToken) {
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

    /// The hosted role logs through the kubelet's logger: a `logging` block in its file is
    /// named in a warning, and a file without one gives none.
    #[test]
    fn a_logging_block_in_the_proxy_config_is_warned_about() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("proxy.yaml");
        let head = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";
        std::fs::write(&p, head).unwrap();
        assert_eq!(hosted_logging_warning(&p, &load(&p, "n").unwrap()), None);
        std::fs::write(&p, format!("{head}logging:\n  format: json\n")).unwrap();
        let msg = hosted_logging_warning(&p, &load(&p, "n").unwrap()).expect("a warning");
        assert!(
            msg.contains("logging") && msg.contains("KubeletConfiguration"),
            "{msg}"
        );
    }

    /// A `clientConnection.kubeconfig` is the role's own identity, also in cluster mode (it
    /// used to be ignored there: the role ran as the node whatever the file said); without
    /// one the role runs as the node and warns, naming `system:node-proxier`.
    #[test]
    fn the_role_takes_its_own_credentials_when_configured() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("proxy.yaml");
        std::fs::write(
            &p,
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclientConnection:\n  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf\n",
        )
        .unwrap();
        let cfg = load(&p, "node-a").unwrap();
        let own = identity(&cfg, true);
        assert_eq!(
            own,
            Identity::Own("clientConnection.kubeconfig /var/lib/kube-proxy/kubeconfig.conf".into())
        );
        let (warn, msg) = identity_message(&own);
        assert!(!warn && msg.contains("system:node-proxier"), "{msg}");
        std::fs::write(
            &p,
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n",
        )
        .unwrap();
        let cfg = load(&p, "node-a").unwrap();
        let node = identity(&cfg, true);
        assert_eq!(node, Identity::Node("system:node:node-a".into()));
        let (warn, msg) = identity_message(&node);
        assert!(warn, "a node identity is a warning");
        for part in [
            "system:node:node-a",
            "EndpointSlices",
            "system:node-proxier",
        ] {
            assert!(msg.contains(part), "{part}: {msg}");
        }
        assert_eq!(identity(&cfg, false), Identity::Standalone);
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
