//! Writes the kubelet's events ([`crate::events`]) as core/v1 Events (`source.component:
//! kubelet`), with client-go's
//! habits simplified: a repeat of the same event on the same object bumps `count` and
//! `lastTimestamp` instead of creating a new object, and a per-object token bucket (burst 25,
//! one more every 5 minutes) drops floods. Every request the writer sends waits for a token of
//! its own client-side bucket, as upstream's separate event client does: `eventRecordQPS` /
//! `eventBurst` (default 50 / 100; 0 is client-go's default of 5 a second / bursts of 10, as
//! upstream's kubelet gets). While it waits, new events queue (1000) and then are dropped.

use super::client::{self, ClientHandle};
use crate::events::{EventRecorder, EventType};
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// One event to write.
#[derive(Debug, Clone)]
struct Pending {
    object: ObjectReference,
    event_type: EventType,
    reason: String,
    message: String,
    /// The Event's `metadata.annotations` (client-go's AnnotatedEventf).
    annotations: BTreeMap<String, String>,
    at: jiff::Timestamp,
}

/// Sends events to an [`EventSink`].
#[derive(Debug, Clone)]
pub struct ApiRecorder {
    tx: mpsc::Sender<Pending>,
}

impl EventRecorder for ApiRecorder {
    fn record_annotated(
        &self,
        object: &ObjectReference,
        event_type: EventType,
        reason: &str,
        message: &str,
        annotations: &BTreeMap<String, String>,
    ) {
        let p = Pending {
            object: object.clone(),
            event_type,
            reason: reason.into(),
            message: message.into(),
            annotations: annotations.clone(),
            at: jiff::Timestamp::now(),
        };
        if self.tx.try_send(p).is_err() {
            tracing::debug!(reason, "event queue full; event dropped");
        }
    }
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last: jiff::Timestamp,
}

#[derive(Debug, Clone)]
struct Written {
    name: String,
    count: i32,
}

/// Writes events to the apiserver.
pub struct EventSink {
    host: String,
    rx: mpsc::Receiver<Pending>,
    seen: HashMap<String, Written>,
    buckets: HashMap<String, Bucket>,
    /// The event client's rate limit (`eventRecordQPS`/`eventBurst`).
    limit: client::TokenBucket,
}

/// client-go's rest defaults, which a QPS or burst of 0 becomes.
const CLIENT_DEFAULT_QPS: i32 = 5;
const CLIENT_DEFAULT_BURST: i32 = 10;
/// Upstream's eventRecordQPS / eventBurst defaults.
pub const DEFAULT_QPS: i32 = 50;
pub const DEFAULT_BURST: i32 = 100;

const BURST: f64 = 25.0;
const REFILL_PER_SEC: f64 = 1.0 / 300.0;
const CACHE_MAX: usize = 4096;

/// A recorder and the sink that writes what it records (queue of 1000, like client-go).
pub fn channel(host: &str) -> (ApiRecorder, EventSink) {
    let (tx, rx) = mpsc::channel(1000);
    (
        ApiRecorder { tx },
        EventSink {
            host: host.into(),
            rx,
            seen: HashMap::new(),
            buckets: HashMap::new(),
            limit: limit(DEFAULT_QPS, DEFAULT_BURST),
        },
    )
}

/// The event client's bucket for validated (non-negative) settings.
fn limit(qps: i32, burst: i32) -> client::TokenBucket {
    let qps = if qps == 0 { CLIENT_DEFAULT_QPS } else { qps };
    let burst = if burst == 0 {
        CLIENT_DEFAULT_BURST
    } else {
        burst
    };
    client::TokenBucket::new(f64::from(qps), burst as u32)
}

fn object_key(o: &ObjectReference) -> String {
    format!(
        "{}/{}/{}/{}/{}",
        o.kind.as_deref().unwrap_or(""),
        o.namespace.as_deref().unwrap_or(""),
        o.name.as_deref().unwrap_or(""),
        o.uid.as_deref().unwrap_or(""),
        o.field_path.as_deref().unwrap_or("")
    )
}

/// The spam filter's key: the object without its field path (client-go's getSpamKey), so
/// the containers of one pod share the pod's bucket.
fn spam_key(o: &ObjectReference) -> String {
    format!(
        "{}/{}/{}/{}/{}",
        o.kind.as_deref().unwrap_or(""),
        o.namespace.as_deref().unwrap_or(""),
        o.name.as_deref().unwrap_or(""),
        o.uid.as_deref().unwrap_or(""),
        o.api_version.as_deref().unwrap_or("")
    )
}

impl EventSink {
    /// `eventRecordQPS` / `eventBurst` for the writer's requests.
    pub fn with_rate_limit(mut self, qps: i32, burst: i32) -> EventSink {
        self.limit = limit(qps, burst);
        self
    }

    /// Waits for a token of the event client's bucket (client-go's rate limiter waits too).
    async fn throttle(&mut self) {
        while let Err(wait) = self.limit.try_take(tokio::time::Instant::now()) {
            tokio::time::sleep(wait).await;
        }
    }

    /// Whether the per-object spam filter lets this event through.
    fn allow(&mut self, key: &str, now: jiff::Timestamp) -> bool {
        let b = self.buckets.entry(key.to_string()).or_insert(Bucket {
            tokens: BURST,
            last: now,
        });
        let elapsed = now.duration_since(b.last).as_secs_f64().max(0.0);
        b.tokens = (b.tokens + elapsed * REFILL_PER_SEC).min(BURST);
        b.last = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    fn event(
        &self,
        p: &Pending,
        name: &str,
        namespace: &str,
        count: i32,
        first: jiff::Timestamp,
    ) -> Event {
        Event {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(namespace.into()),
                annotations: (!p.annotations.is_empty()).then(|| p.annotations.clone()),
                ..Default::default()
            },
            involved_object: p.object.clone(),
            reason: Some(p.reason.clone()),
            message: Some(p.message.clone()),
            type_: Some(p.event_type.as_str().into()),
            source: Some(EventSource {
                component: Some("kubelet".into()),
                host: Some(self.host.clone()),
            }),
            first_timestamp: Some(Time(first)),
            last_timestamp: Some(Time(p.at)),
            count: Some(count),
            reporting_component: Some("kubelet".into()),
            reporting_instance: Some(self.host.clone()),
            ..Default::default()
        }
    }

    async fn write(&mut self, client: kube::Client, p: Pending) {
        let okey = object_key(&p.object);
        if !self.allow(&spam_key(&p.object), p.at) {
            tracing::debug!(reason = %p.reason, object = %okey, "event rate limit; dropped");
            return;
        }
        let key = format!(
            "{okey}/{}/{}/{}",
            p.event_type.as_str(),
            p.reason,
            p.message
        );
        let namespace = p
            .object
            .namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".into());
        let api: Api<Event> = Api::namespaced(client, &namespace);
        if let Some(w) = self.seen.get(&key).cloned() {
            let count = w.count + 1;
            let patch = serde_json::json!({"count": count, "lastTimestamp": Time(p.at), "message": p.message});
            self.throttle().await;
            match client::timed(api.patch(&w.name, &PatchParams::default(), &Patch::Merge(&patch)))
                .await
            {
                Ok(_) => {
                    self.seen.insert(key, Written { count, ..w });
                    return;
                }
                Err(e) if client::status_code(&e) == Some(404) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "updating an event failed; dropped");
                    return;
                }
            }
        }
        let nanos = p.at.as_nanosecond();
        let name = format!(
            "{}.{:x}",
            p.object.name.as_deref().unwrap_or("unknown"),
            nanos
        );
        let ev = self.event(&p, &name, &namespace, 1, p.at);
        self.throttle().await;
        match client::timed(api.create(&PostParams::default(), &ev)).await {
            Ok(_) => {
                if self.seen.len() >= CACHE_MAX {
                    self.seen.clear();
                }
                self.seen.insert(key, Written { name, count: 1 });
            }
            Err(e) => {
                tracing::debug!(error = %e, reason = %p.reason, "writing an event failed; dropped")
            }
        }
        if self.buckets.len() > CACHE_MAX {
            self.buckets.clear();
        }
    }

    pub async fn run(mut self, client: ClientHandle, cancel: CancellationToken) {
        loop {
            let p = tokio::select! {
                _ = cancel.cancelled() => return,
                p = self.rx.recv() => match p { Some(p) => p, None => return },
            };
            // An event write never blocks shutdown for long.
            let _ = tokio::time::timeout(Duration::from_secs(35), self.write(client.current(), p))
                .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spam_filter_allows_burst_then_drops() {
        let (_r, mut sink) = channel("n");
        let now = jiff::Timestamp::now();
        for _ in 0..25 {
            assert!(sink.allow("k", now));
        }
        assert!(!sink.allow("k", now));
        assert!(sink.allow("other", now));
        assert!(sink.allow("k", now + jiff::SignedDuration::from_secs(300)));
    }

    /// As client-go's spam key: one bucket per object, whatever container (field path) an
    /// event names; different objects (or UIDs) have their own.
    #[test]
    fn the_containers_of_a_pod_share_its_spam_bucket() {
        let container = |c: &str, uid: &str| ObjectReference {
            kind: Some("Pod".into()),
            namespace: Some("ns".into()),
            name: Some("p".into()),
            uid: Some(uid.into()),
            field_path: Some(format!("spec.containers{{{c}}}")),
            ..Default::default()
        };
        assert_eq!(
            spam_key(&container("a", "u")),
            spam_key(&container("b", "u"))
        );
        assert_ne!(
            spam_key(&container("a", "u")),
            spam_key(&container("a", "v"))
        );
        let (_r, mut sink) = channel("n");
        let now = jiff::Timestamp::now();
        for i in 0..25 {
            let c = container(if i % 2 == 0 { "a" } else { "b" }, "u");
            assert!(sink.allow(&spam_key(&c), now));
        }
        assert!(!sink.allow(&spam_key(&container("c", "u")), now));
    }

    #[test]
    fn annotations_go_on_the_event_object() {
        let (_r, sink) = channel("n");
        let p = Pending {
            object: ObjectReference {
                kind: Some("Pod".into()),
                name: Some("p".into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            event_type: EventType::Warning,
            reason: "Evicted".into(),
            message: "m".into(),
            annotations: [("starved_resource".to_string(), "memory".to_string())].into(),
            at: jiff::Timestamp::now(),
        };
        let ev = serde_json::to_value(sink.event(&p, "p.1", "ns", 1, p.at)).unwrap();
        assert_eq!(
            ev["metadata"]["annotations"],
            serde_json::json!({"starved_resource": "memory"})
        );
        let plain = Pending {
            annotations: BTreeMap::new(),
            ..p
        };
        let ev = serde_json::to_value(sink.event(&plain, "p.2", "ns", 1, plain.at)).unwrap();
        assert!(ev["metadata"].get("annotations").is_none(), "{ev}");
    }

    /// Sends `n` events about `n` different pods through a sink limited to `qps`/`burst`
    /// against an apiserver that answers every create; returns when each request arrived,
    /// relative to the first. Paused clock: the waits are the bucket's, not real time.
    async fn request_times(qps: i32, burst: i32, n: usize) -> Vec<Duration> {
        let times = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = times.clone();
        let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            seen.lock().unwrap().push(tokio::time::Instant::now());
            async move {
                assert_eq!(req.method(), http::Method::POST);
                let body = serde_json::to_vec(&serde_json::json!({
                    "apiVersion": "v1", "kind": "Event",
                    "metadata": {"name": "x", "namespace": "ns"},
                    "involvedObject": {}
                }))
                .unwrap();
                Ok::<_, std::convert::Infallible>(
                    http::Response::builder()
                        .status(201)
                        .body(kube::client::Body::from(body))
                        .unwrap(),
                )
            }
        });
        let (handle, _publisher) = ClientHandle::new(kube::Client::new(svc, "default"));
        let (recorder, sink) = channel("n");
        let sink = sink.with_rate_limit(qps, burst);
        for i in 0..n {
            let pod = ObjectReference {
                kind: Some("Pod".into()),
                namespace: Some("ns".into()),
                name: Some(format!("p{i}")),
                ..Default::default()
            };
            recorder.record(&pod, EventType::Normal, "Pulled", "m");
        }
        let cancel = CancellationToken::new();
        let task = tokio::spawn(sink.run(handle, cancel.clone()));
        for _ in 0..10_000 {
            if times.lock().unwrap().len() >= n {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        cancel.cancel();
        task.await.unwrap();
        let times = times.lock().unwrap();
        times.iter().map(|t| *t - times[0]).collect()
    }

    /// eventRecordQPS 1 / eventBurst 2: two writes at once, then one a second.
    #[tokio::test(start_paused = true)]
    async fn event_writes_wait_for_the_event_qps_bucket() {
        let t = request_times(1, 2, 5).await;
        assert_eq!(t.len(), 5);
        assert!(t[1] < Duration::from_millis(50), "{t:?}");
        for (i, at) in t.iter().enumerate().skip(2) {
            let want = Duration::from_secs(i as u64 - 1);
            assert!(
                *at >= want && *at < want + Duration::from_millis(50),
                "write {i} at {at:?}, want ~{want:?}: {t:?}"
            );
        }
    }

    /// 0 is not "no limit": upstream's event client gets client-go's defaults (5/s, bursts
    /// of 10), so the 11th write waits ~200 ms.
    #[tokio::test(start_paused = true)]
    async fn zero_event_qps_is_client_gos_default_rate() {
        let t = request_times(0, 0, 12).await;
        assert!(t[9] < Duration::from_millis(50), "{t:?}");
        assert!(t[10] >= Duration::from_millis(199), "{t:?}");
        assert!(t[11] >= Duration::from_millis(399), "{t:?}");
    }
}
