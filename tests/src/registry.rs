//! A minimal read-only OCI distribution (Docker Registry HTTP API v2) server for tests:
//! plain HTTP, optional basic auth, serving the manifests and blobs of OCI image-layout
//! directories (as the rig's image tarballs unpack). Enough for containerd to resolve and
//! pull: `GET /v2/`, `GET|HEAD /v2/<name>/manifests/<tag|digest>`,
//! `GET|HEAD /v2/<name>/blobs/<digest>`. Manifest answers can be held back
//! ([`Stats::manifest_delay_ms`]) to show how many pulls overlap.

use std::collections::HashMap;
use std::convert::Infallible;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use base64::Engine;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

/// What the registry serves.
#[derive(Debug, Default)]
pub struct Content {
    /// `(repository, tag)` → manifest digest.
    tags: HashMap<(String, String), String>,
    /// Manifest digest → (media type, body).
    manifests: HashMap<String, (String, Bytes)>,
    /// Blob digest → body.
    blobs: HashMap<String, Bytes>,
}

impl Content {
    /// Serves the image of an OCI image-layout directory (`index.json`, `blobs/sha256/`)
    /// as `repository:tag`.
    pub fn add_layout(&mut self, dir: &Path, repository: &str, tag: &str) -> anyhow::Result<()> {
        let index: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("index.json"))?)?;
        let entry = &index["manifests"][0];
        let digest = entry["digest"]
            .as_str()
            .ok_or_else(|| anyhow::anyhow!("index.json has no manifest"))?
            .to_string();
        let media_type = entry["mediaType"]
            .as_str()
            .unwrap_or("application/vnd.oci.image.manifest.v1+json")
            .to_string();
        let blob_dir = dir.join("blobs/sha256");
        for f in std::fs::read_dir(&blob_dir)? {
            let f = f?;
            let name = f.file_name().to_string_lossy().into_owned();
            self.blobs.insert(
                format!("sha256:{name}"),
                Bytes::from(std::fs::read(f.path())?),
            );
        }
        let body = self
            .blobs
            .get(&digest)
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("manifest blob {digest} missing"))?;
        self.manifests.insert(digest.clone(), (media_type, body));
        self.tags
            .insert((repository.to_string(), tag.to_string()), digest);
        Ok(())
    }
}

/// A running registry's counters.
#[derive(Debug, Default)]
pub struct Stats {
    /// Requests refused with 401.
    pub unauthorized: AtomicUsize,
    /// Manifests served to an authorised client.
    pub manifests_served: AtomicUsize,
    /// Milliseconds each manifest request is held before it is answered (0: none), so that
    /// pulls in flight at once overlap visibly.
    pub manifest_delay_ms: AtomicU64,
    /// Manifest requests being held now, and the most held at once.
    pub manifests_in_flight: AtomicUsize,
    pub max_manifests_in_flight: AtomicUsize,
}

struct Shared {
    content: Content,
    /// The `Authorization` header value required (None: open).
    auth: Option<String>,
    stats: Arc<Stats>,
}

fn reply(status: StatusCode, headers: &[(&str, String)], body: Bytes) -> Response<Full<Bytes>> {
    let mut b = Response::builder()
        .status(status)
        .header("Docker-Distribution-API-Version", "registry/2.0");
    for (k, v) in headers {
        b = b.header(*k, v);
    }
    b.body(Full::new(body)).unwrap_or_default()
}

fn handle(shared: &Shared, req: &Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
    if let Some(want) = &shared.auth {
        let got = req
            .headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        if got != Some(want.as_str()) {
            shared.stats.unauthorized.fetch_add(1, Ordering::SeqCst);
            return reply(
                StatusCode::UNAUTHORIZED,
                &[(
                    "WWW-Authenticate",
                    "Basic realm=\"test-registry\"".to_string(),
                )],
                Bytes::from_static(b"{\"errors\":[{\"code\":\"UNAUTHORIZED\"}]}"),
            );
        }
    }
    let head = req.method() == Method::HEAD;
    if req.method() != Method::GET && !head {
        return reply(StatusCode::METHOD_NOT_ALLOWED, &[], Bytes::new());
    }
    let path = req.uri().path();
    if path == "/v2/" || path == "/v2" {
        return reply(StatusCode::OK, &[], Bytes::from_static(b"{}"));
    }
    let Some(rest) = path.strip_prefix("/v2/") else {
        return reply(StatusCode::NOT_FOUND, &[], Bytes::new());
    };
    let found = if let Some((name, reference)) = rest.rsplit_once("/manifests/") {
        let digest = if reference.starts_with("sha256:") {
            Some(reference.to_string())
        } else {
            shared
                .content
                .tags
                .get(&(name.to_string(), reference.to_string()))
                .cloned()
        };
        digest.and_then(|d| {
            shared.content.manifests.get(&d).map(|(t, b)| {
                shared.stats.manifests_served.fetch_add(1, Ordering::SeqCst);
                (d.clone(), t.clone(), b.clone())
            })
        })
    } else if let Some((_, digest)) = rest.rsplit_once("/blobs/") {
        shared.content.blobs.get(digest).map(|b| {
            (
                digest.to_string(),
                "application/octet-stream".to_string(),
                b.clone(),
            )
        })
    } else {
        None
    };
    match found {
        Some((digest, media_type, body)) => reply(
            StatusCode::OK,
            &[
                ("Content-Type", media_type),
                ("Docker-Content-Digest", digest),
                ("Content-Length", body.len().to_string()),
            ],
            if head { Bytes::new() } else { body },
        ),
        None => reply(
            StatusCode::NOT_FOUND,
            &[],
            Bytes::from_static(b"{\"errors\":[{\"code\":\"MANIFEST_UNKNOWN\"}]}"),
        ),
    }
}

/// Serves `content` on `listener` until the task is dropped; with `basic_auth`
/// (user, password) every request must carry those credentials.
pub async fn serve(
    listener: TcpListener,
    content: Content,
    basic_auth: Option<(String, String)>,
    stats: Arc<Stats>,
) {
    let auth = basic_auth.map(|(u, p)| {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
        )
    });
    let shared = Arc::new(Shared {
        content,
        auth,
        stats,
    });
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let shared = shared.clone();
                async move {
                    let delay = shared.stats.manifest_delay_ms.load(Ordering::SeqCst);
                    if delay > 0 && req.uri().path().contains("/manifests/") {
                        let st = &shared.stats;
                        let now = st.manifests_in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                        st.max_manifests_in_flight.fetch_max(now, Ordering::SeqCst);
                        tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
                        st.manifests_in_flight.fetch_sub(1, Ordering::SeqCst);
                    }
                    Ok::<_, Infallible>(handle(&shared, &req))
                }
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        });
    }
}
