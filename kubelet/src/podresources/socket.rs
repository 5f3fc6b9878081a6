//! The pod resources socket: `<root-dir>/pod-resources/kubelet.sock`, in a directory of mode
//! 0750 (as upstream creates it) and itself mode 0600, so only root (the agent's user) can
//! connect. The socket is bound under a temporary name, restricted, then renamed into place
//! (upstream's `CreateListener` does the same), so it is never reachable with a looser mode;
//! a stale socket from an earlier run is replaced. A directory that is a symlink, or a path
//! that is a directory, is refused rather than followed or removed.

use super::PodResources;
use cri_proto::podresources::{DIR_NAME, SOCKET, v1 as api};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Mode of the socket directory (upstream's 0750).
pub const DIR_MODE: u32 = 0o750;
/// Mode of the socket: owner only.
pub const SOCKET_MODE: u32 = 0o600;

/// Why the socket could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("pod resources directory {dir}: {source}")]
    Dir { dir: String, source: std::io::Error },
    #[error(
        "pod resources directory {0} is not a directory (a symlink or another file); refusing to serve there"
    )]
    NotADir(String),
    #[error("pod resources socket {path}: {source}")]
    Listen {
        path: String,
        source: std::io::Error,
    },
}

/// Makes the directory and binds the socket (blocking).
pub(super) fn bind(
    root_dir: &Path,
) -> Result<(std::os::unix::net::UnixListener, PathBuf), ServeError> {
    let dir = root_dir.join(DIR_NAME);
    let dir_err = |source| ServeError::Dir {
        dir: dir.display().to_string(),
        source,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(&dir)
        .map_err(dir_err)?;
    let meta = std::fs::symlink_metadata(&dir).map_err(dir_err)?;
    if !meta.file_type().is_dir() {
        return Err(ServeError::NotADir(dir.display().to_string()));
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(DIR_MODE)).map_err(dir_err)?;
    let path = dir.join(SOCKET);
    let listen_err = |source| ServeError::Listen {
        path: path.display().to_string(),
        source,
    };
    match std::fs::symlink_metadata(&path) {
        Ok(m) if m.file_type().is_dir() => {
            return Err(listen_err(std::io::Error::other(
                "a directory is in the way",
            )));
        }
        // A stale socket, or anything else planted there: unlinked, never followed.
        Ok(_) => std::fs::remove_file(&path).map_err(listen_err)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(listen_err(e)),
    }
    let tmp = dir.join(format!(".{SOCKET}.{}", std::process::id()));
    if let Ok(m) = std::fs::symlink_metadata(&tmp)
        && (m.file_type().is_socket() || m.file_type().is_symlink() || m.file_type().is_file())
    {
        std::fs::remove_file(&tmp).map_err(listen_err)?;
    }
    let listener = std::os::unix::net::UnixListener::bind(&tmp).map_err(listen_err)?;
    let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(SOCKET_MODE))
        .and_then(|()| std::fs::rename(&tmp, &path))
        .and_then(|()| listener.set_nonblocking(true));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(listen_err(e));
    }
    Ok((listener, path))
}

/// Serves `service` on `<root_dir>/pod-resources/kubelet.sock` until `cancel`.
pub async fn serve(
    root_dir: PathBuf,
    service: Arc<PodResources>,
    cancel: CancellationToken,
) -> Result<(), ServeError> {
    let (listener, path) = tokio::task::spawn_blocking(move || bind(&root_dir))
        .await
        .map_err(|e| ServeError::Dir {
            dir: DIR_NAME.into(),
            source: std::io::Error::other(e.to_string()),
        })??;
    let listener =
        tokio::net::UnixListener::from_std(listener).map_err(|source| ServeError::Listen {
            path: path.display().to_string(),
            source,
        })?;
    tracing::info!(endpoint = %path.display(), "starting to serve the podresources API");
    let incoming = cri_proto::uds::incoming(listener);
    let alpha = cri_proto::podresources::v1alpha1::pod_resources_lister_server::PodResourcesListerServer::new(
        super::V1Alpha1(service.clone()),
    );
    let svc = api::pod_resources_lister_server::PodResourcesListerServer::from_arc(service);
    let res = tonic::transport::Server::builder()
        .add_service(svc)
        .add_service(alpha)
        .serve_with_incoming_shutdown(incoming, cancel.cancelled())
        .await;
    if let Err(e) = res {
        tracing::warn!(error = %e, "pod resources server stopped");
    }
    Ok(())
}
