//! The kubelet's gRPC APIs on node-local unix sockets, as tonic/prost clients and servers.
//! Despite the crate's name it holds more than the CRI:
//!
//! * [`v1`]: the CRI v1 API (`runtime.v1`), every message and enum plus the generated
//!   tonic clients and servers. Server traits have default stubs: an RPC a fake does not
//!   implement answers `UNIMPLEMENTED`. [`connect`] / [`connect_lazy`] open a [`Channel`] to a
//!   runtime socket; [`runtime_client`] / [`image_client`] wrap it with the kubelet's 16 MiB
//!   message limits.
//! * [`deviceplugin`]: the device plugin API v1beta1 (the kubelet's `Registration` service,
//!   each plugin's `DevicePlugin` service).
//! * [`dra`]: the DRA kubelet plugin API (`NodePrepareResources`, `NodeUnprepareResources`,
//!   v1 and v1beta1).
//! * [`podresources`]: the pod resources API v1 (and v1alpha1's `List`) the kubelet serves
//!   to monitoring agents, with a client.
//! * [`plugins`]: plugin registration (`pluginregistration` v1, spoken by CSI, device and
//!   DRA plugins) and CSI's Identity and Node services (`csi.v1`).
//! * [`uds::incoming`]: the connections of a unix-socket gRPC server, accepting the
//!   `:authority` that grpc-python, grpc-java and grpc-dotnet send there.
//! * `fake` (feature `test-util`): a recording, error-injecting CRI server for tests.
//! * the `cri` binary: a small crictl.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Endpoint, Uri};

pub use tonic::transport::Channel;

pub mod deviceplugin;
pub mod dra;
#[cfg(any(test, feature = "test-util"))]
pub mod fake;
pub mod plugins;
pub mod podresources;
pub mod uds;

/// Generated `runtime.v1` types, clients and servers.
pub mod v1 {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    tonic::include_proto!("runtime.v1");
}

pub use v1::image_service_client::{self, ImageServiceClient};
pub use v1::image_service_server::{self, ImageService, ImageServiceServer};
pub use v1::runtime_service_client::{self, RuntimeServiceClient};
pub use v1::runtime_service_server::{self, RuntimeService, RuntimeServiceServer};

/// Largest gRPC message sent or accepted, in bytes (the kubelet's limit).
pub const MAX_MSG_SIZE: usize = 16 * 1024 * 1024;

/// The CRI API version string the kubelet sends in `VersionRequest`.
pub const CRI_API_VERSION: &str = "v1";

/// Errors from endpoint parsing and connecting (to a runtime or to a node plugin: the
/// messages name the socket, the caller says what it is).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The endpoint string is not a usable unix-socket endpoint.
    #[error("invalid gRPC endpoint {endpoint:?}: {reason}")]
    BadEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// Why it was rejected.
        reason: String,
    },
    /// The socket could not be reached.
    #[error("cannot connect to gRPC endpoint {endpoint}: {detail}")]
    Transport {
        /// The endpoint as given.
        endpoint: String,
        /// The whole error chain, flattened so one-line logs show the cause.
        detail: String,
        /// The underlying transport error (already part of `detail`, so not
        /// reported again as `source()`).
        error: tonic::transport::Error,
    },
}

impl Error {
    /// Why, without the endpoint (for callers that name the endpoint themselves).
    pub fn cause(&self) -> &str {
        match self {
            Error::BadEndpoint { reason, .. } => reason,
            Error::Transport { detail, .. } => detail,
        }
    }
}

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Socket path of a CRI endpoint.
///
/// Accepts `unix:///abs/path`, `unix:/abs/path` and a bare absolute path.
/// TCP and Windows named-pipe endpoints are rejected.
pub fn parse_endpoint(endpoint: &str) -> Result<PathBuf> {
    let bad = |reason: &str| Error::BadEndpoint {
        endpoint: endpoint.to_string(),
        reason: reason.to_string(),
    };
    let trimmed = endpoint.trim();
    if trimmed.is_empty() {
        return Err(bad("empty endpoint"));
    }
    let path = if let Some(rest) = trimmed.strip_prefix("unix://") {
        rest
    } else if let Some(rest) = trimmed.strip_prefix("unix:") {
        rest
    } else if trimmed.starts_with('/') {
        trimmed
    } else if let Some((scheme, _)) = trimmed.split_once("://") {
        return Err(bad(&format!(
            "scheme {scheme:?} is not supported; only unix sockets are (unix:///path/to/socket)"
        )));
    } else {
        return Err(bad(
            "expected unix:///path/to/socket or an absolute socket path",
        ));
    };
    if !path.starts_with('/') {
        return Err(bad("socket path must be absolute"));
    }
    Ok(PathBuf::from(path))
}

fn endpoint_for(endpoint: &str, connect_timeout: Duration) -> Result<Endpoint> {
    // The connector ignores the URI and dials the socket; the URI gives the requests'
    // `:authority`, `localhost` as upstream's kubelet sends over unix sockets (grpc-go's
    // `WithAuthority("localhost")`), which every server takes as a host name.
    let ep = Endpoint::try_from("http://localhost").map_err(|e| Error::BadEndpoint {
        endpoint: endpoint.to_string(),
        reason: e.to_string(),
    })?;
    Ok(ep.connect_timeout(connect_timeout))
}

fn unix_connector(
    path: PathBuf,
) -> impl tower::Service<
    Uri,
    Response = TokioIo<UnixStream>,
    Error = std::io::Error,
    Future = impl Future<Output = std::io::Result<TokioIo<UnixStream>>> + Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move {
            let stream = UnixStream::connect(&path)
                .await
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
            Ok::<_, std::io::Error>(TokioIo::new(stream))
        }
    })
}

/// Flattens an error and its sources into `a: b: c`.
fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let s = e.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cur = e.source();
    }
    out
}

/// Connects eagerly to the runtime socket at `endpoint`.
///
/// Fails fast (within `connect_timeout`) if the socket is absent or refuses.
/// Once connected, the channel survives runtime restarts: after the
/// connection drops, in-flight calls fail with `UNAVAILABLE` and the next
/// call dials the socket again.
pub async fn connect(endpoint: &str, connect_timeout: Duration) -> Result<Channel> {
    let path = parse_endpoint(endpoint)?;
    let ep = endpoint_for(endpoint, connect_timeout)?;
    tracing::debug!(endpoint, path = %path.display(), "connecting to CRI runtime");
    ep.connect_with_connector(unix_connector(path))
        .await
        .map_err(|error| Error::Transport {
            endpoint: endpoint.to_string(),
            detail: chain(&error),
            error,
        })
}

/// Builds a channel that dials the socket on first use (and again after
/// every disconnect). Only the endpoint syntax is checked here.
pub fn connect_lazy(endpoint: &str, connect_timeout: Duration) -> Result<Channel> {
    let path = parse_endpoint(endpoint)?;
    let ep = endpoint_for(endpoint, connect_timeout)?;
    Ok(ep.connect_with_connector_lazy(unix_connector(path)))
}

/// A RuntimeService client with 16 MiB encode/decode limits.
pub fn runtime_client(ch: Channel) -> RuntimeServiceClient<Channel> {
    RuntimeServiceClient::new(ch)
        .max_decoding_message_size(MAX_MSG_SIZE)
        .max_encoding_message_size(MAX_MSG_SIZE)
}

/// An ImageService client with 16 MiB encode/decode limits.
pub fn image_client(ch: Channel) -> ImageServiceClient<Channel> {
    ImageServiceClient::new(ch)
        .max_decoding_message_size(MAX_MSG_SIZE)
        .max_encoding_message_size(MAX_MSG_SIZE)
}

/// A RuntimeService server (for fakes) with 16 MiB encode/decode limits.
pub fn runtime_server<T: RuntimeService>(svc: T) -> RuntimeServiceServer<T> {
    RuntimeServiceServer::new(svc)
        .max_decoding_message_size(MAX_MSG_SIZE)
        .max_encoding_message_size(MAX_MSG_SIZE)
}

/// An ImageService server (for fakes) with 16 MiB encode/decode limits.
pub fn image_server<T: ImageService>(svc: T) -> ImageServiceServer<T> {
    ImageServiceServer::new(svc)
        .max_decoding_message_size(MAX_MSG_SIZE)
        .max_encoding_message_size(MAX_MSG_SIZE)
}

/// True if `path` exists and is a unix socket.
pub fn is_socket(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path)
        .map(|m| m.file_type().is_socket())
        .unwrap_or(false)
}

const REDACTED: &str = "<redacted>";

fn redact(s: &str) -> &str {
    if s.is_empty() { "" } else { REDACTED }
}

// Upstream marks the secret fields debug_redact; keep them out of logs.
impl fmt::Debug for v1::AuthConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuthConfig")
            .field("username", &self.username)
            .field("password", &redact(&self.password))
            .field("auth", &redact(&self.auth))
            .field("server_address", &self.server_address)
            .field("identity_token", &redact(&self.identity_token))
            .field("registry_token", &redact(&self.registry_token))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_unix_endpoints() {
        let want = PathBuf::from("/run/containerd/containerd.sock");
        for ep in [
            "unix:///run/containerd/containerd.sock",
            "unix:/run/containerd/containerd.sock",
            "/run/containerd/containerd.sock",
            " unix:///run/containerd/containerd.sock ",
        ] {
            assert_eq!(parse_endpoint(ep).unwrap(), want, "{ep}");
        }
    }

    #[test]
    fn rejects_other_endpoints() {
        for (ep, needle) in [
            ("tcp://127.0.0.1:1234", "\"tcp\""),
            ("npipe:////./pipe/containerd", "\"npipe\""),
            ("unix://run/containerd.sock", "absolute"),
            ("relative.sock", "expected unix"),
            ("", "empty"),
        ] {
            let err = parse_endpoint(ep).unwrap_err();
            assert!(matches!(err, Error::BadEndpoint { .. }), "{ep}: {err}");
            assert!(err.to_string().contains(needle), "{ep}: {err}");
        }
    }

    #[test]
    fn auth_config_debug_hides_secrets() {
        let a = v1::AuthConfig {
            username: "bob".into(),
            password: "hunter2".into(),
            auth: "Ym9iOmh1bnRlcjI=".into(),
            server_address: "registry.example".into(),
            identity_token: String::new(),
            registry_token: "tok".into(),
        };
        let s = format!("{a:?}");
        assert!(s.contains("bob") && s.contains("registry.example"), "{s}");
        for secret in ["hunter2", "Ym9iOmh1bnRlcjI=", "tok\""] {
            assert!(!s.contains(secret), "{s}");
        }
        assert!(s.contains(REDACTED));
    }

    /// Encodes `msg` and returns its first field key (field number, wire type).
    fn first_key(msg: &impl prost::Message) -> (u64, u64) {
        let buf = msg.encode_to_vec();
        let mut key = 0u64;
        for (i, b) in buf.iter().enumerate() {
            key |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                break;
            }
        }
        (key >> 3, key & 7)
    }

    #[test]
    fn field_numbers_match_upstream() {
        // Spot checks of numbers that are out of sequence upstream.
        let spec = v1::ImageSpec {
            user_specified_image: "a".into(),
            ..Default::default()
        };
        assert_eq!(first_key(&spec), (18, 2));
        let spec = v1::ImageSpec {
            image_ref: "a".into(),
            ..Default::default()
        };
        assert_eq!(first_key(&spec), (20, 2));
        let sc = v1::LinuxSandboxSecurityContext {
            run_as_group: Some(v1::Int64Value { value: 1 }),
            ..Default::default()
        };
        assert_eq!(first_key(&sc), (8, 2));
        let sc = v1::LinuxSandboxSecurityContext {
            supplemental_groups_policy: v1::SupplementalGroupsPolicy::Strict as i32,
            ..Default::default()
        };
        assert_eq!(first_key(&sc), (11, 0));
        let sc = v1::LinuxContainerSecurityContext {
            supplemental_groups_policy: v1::SupplementalGroupsPolicy::Strict as i32,
            ..Default::default()
        };
        assert_eq!(first_key(&sc), (17, 0));
        let sc = v1::LinuxContainerSecurityContext {
            run_as_group: Some(v1::Int64Value { value: 1 }),
            ..Default::default()
        };
        assert_eq!(first_key(&sc), (12, 2));
        let cc = v1::ContainerConfig {
            stop_signal: v1::Signal::Sigterm as i32,
            ..Default::default()
        };
        assert_eq!(first_key(&cc), (18, 0));
        assert_eq!(v1::Signal::Sigterm as i32, 23);
        assert_eq!(v1::Signal::Sigrtmax as i32, 65);
        let ns = v1::Namespace {
            options: Some(v1::NamespaceOption::default()),
        };
        assert_eq!(first_key(&ns), (2, 2));
        let cs = v1::ContainerStatus {
            stop_signal: v1::Signal::Sigkill as i32,
            ..Default::default()
        };
        assert_eq!(first_key(&cs), (19, 0));
        assert_eq!(v1::CgroupDriver::Systemd as i32, 0);
        assert_eq!(v1::CgroupDriver::Cgroupfs as i32, 1);
        assert_eq!(
            v1::NamespaceMode::Target.as_str_name(),
            "TARGET",
            "enum names keep upstream spelling"
        );
    }

    #[test]
    fn services_expose_upstream_paths() {
        use tonic::server::NamedService;
        struct Nop;
        impl RuntimeService for Nop {}
        impl ImageService for Nop {}
        assert_eq!(
            <RuntimeServiceServer<Nop> as NamedService>::NAME,
            "runtime.v1.RuntimeService"
        );
        assert_eq!(
            <ImageServiceServer<Nop> as NamedService>::NAME,
            "runtime.v1.ImageService"
        );
    }
}
