//! Watches: the bounded event history (older resourceVersions get a 410 Expired
//! ERROR event), live watchers with upstream's selector-aware event translation,
//! bookmarks, and the fan-out of every committed change.

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::{Store, set_rv};
use crate::controlplane::resources::ResourceDef;
use crate::controlplane::selectors::{FieldSelector, LabelSelector};
use crate::controlplane::status::ApiError;

/// A message to one watch stream.
#[derive(Debug)]
pub enum WatchMsg {
    /// One newline-terminated JSON event (or an injected raw line).
    Line(Bytes),
    /// End the stream.
    Close,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

#[derive(Debug)]
pub(super) struct HistoryEvent {
    res: &'static ResourceDef,
    kind: EventType,
    rv: u64,
    obj: Value,
    prev: Option<Value>,
}

#[derive(Debug)]
pub(super) struct Watcher {
    id: u64,
    res: &'static ResourceDef,
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
    tx: UnboundedSender<WatchMsg>,
}

impl Watcher {
    fn passes(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.namespace
            && obj.pointer("/metadata/namespace").and_then(Value::as_str) != Some(ns.as_str())
        {
            return false;
        }
        self.labels.matches(obj) && self.fields.matches(obj)
    }

    /// Upstream's cacheWatcher translation: an object that starts matching is
    /// ADDED, one that stops matching is DELETED (old content, new resourceVersion).
    fn translate(&self, ev: &HistoryEvent) -> Option<Bytes> {
        if ev.res.qualified() != self.res.qualified() {
            return None;
        }
        let cur = ev.kind != EventType::Deleted && self.passes(&ev.obj);
        let old = ev.prev.as_ref().is_some_and(|p| self.passes(p));
        let (ty, obj) = match (cur, old) {
            (true, false) => ("ADDED", ev.obj.clone()),
            (true, true) => ("MODIFIED", ev.obj.clone()),
            (false, true) => {
                let mut o = ev.prev.clone().unwrap_or(Value::Null);
                set_rv(&mut o, ev.rv);
                ("DELETED", o)
            }
            (false, false) => return None,
        };
        Some(event_line(ty, &obj))
    }
}

/// One serialized watch event line.
pub fn event_line(ty: &str, obj: &Value) -> Bytes {
    let mut s = serde_json::to_vec(&json!({ "type": ty, "object": obj })).unwrap_or_default();
    s.push(b'\n');
    Bytes::from(s)
}

impl Store {
    /// Keep a committed change in the history (dropping the oldest beyond the
    /// configured length) and hand it to the watchers it concerns.
    pub(super) fn publish(
        &mut self,
        res: &'static ResourceDef,
        kind: EventType,
        rv: u64,
        obj: Value,
        prev: Option<Value>,
    ) {
        let ev = HistoryEvent {
            res,
            kind,
            rv,
            obj,
            prev,
        };
        self.watchers.retain(|w| match w.translate(&ev) {
            Some(line) => w.tx.send(WatchMsg::Line(line)).is_ok(),
            None => !w.tx.is_closed(),
        });
        self.history.push_back(ev);
        while self.history.len() > self.config.history.max(1) {
            if let Some(old) = self.history.pop_front() {
                self.compacted = old.rv;
            }
        }
    }

    /// Drop the whole event history: any older resourceVersion now answers 410.
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted = self.rv;
    }

    /// Register a watcher. `resource_version`: `None`/`0` start with synthetic
    /// ADDED events for the current state; `n` replays history after `n`, or
    /// sends one ERROR event (410 Expired) when `n` is older than the history.
    #[allow(clippy::too_many_arguments)]
    pub fn watch(
        &mut self,
        res: &'static ResourceDef,
        ns: Option<&str>,
        labels: LabelSelector,
        fields: FieldSelector,
        resource_version: Option<u64>,
        send_initial_events: bool,
        allow_bookmarks: bool,
    ) -> (u64, UnboundedSender<WatchMsg>, UnboundedReceiver<WatchMsg>) {
        let (tx, rx) = unbounded_channel();
        let id = self.next_watcher;
        self.next_watcher += 1;
        let w = Watcher {
            id,
            res,
            namespace: ns.filter(|_| res.namespaced).map(str::to_string),
            labels,
            fields,
            tx: tx.clone(),
        };
        match resource_version {
            Some(n) if n > 0 && !send_initial_events => {
                if n < self.compacted {
                    let err = ApiError::expired(format!(
                        "too old resource version: {n} ({})",
                        self.compacted
                    ));
                    let _ = tx.send(WatchMsg::Line(event_line("ERROR", &err.to_status())));
                    let _ = tx.send(WatchMsg::Close);
                    return (id, tx, rx);
                }
                for ev in self.history.iter().filter(|e| e.rv > n) {
                    if let Some(line) = w.translate(ev) {
                        let _ = tx.send(WatchMsg::Line(line));
                    }
                }
            }
            _ => {
                let current = self.select(res, w.namespace.as_deref(), &w.labels, &w.fields);
                for o in &current {
                    let _ = tx.send(WatchMsg::Line(event_line("ADDED", o)));
                }
                if send_initial_events && allow_bookmarks {
                    let bm = self.bookmark_object(res, true);
                    let _ = tx.send(WatchMsg::Line(event_line("BOOKMARK", &bm)));
                }
            }
        }
        self.watchers.push(w);
        (id, tx, rx)
    }

    fn bookmark_object(&self, res: &ResourceDef, initial_end: bool) -> Value {
        let mut m = json!({ "resourceVersion": self.rv.to_string() });
        if initial_end {
            m["annotations"] = json!({ "k8s.io/initial-events-end": "true" });
        }
        json!({ "kind": res.kind, "apiVersion": res.api_version(), "metadata": m })
    }

    /// Queue a BOOKMARK at the current revision on one watcher (ordered after
    /// every event already sent to it).
    pub fn bookmark(&mut self, watcher: u64) {
        if let Some(w) = self.watchers.iter().find(|w| w.id == watcher) {
            let bm = self.bookmark_object(w.res, false);
            let _ = w.tx.send(WatchMsg::Line(event_line("BOOKMARK", &bm)));
        }
    }

    pub fn forget_watcher(&mut self, watcher: u64) {
        self.watchers.retain(|w| w.id != watcher);
    }

    /// Send a raw line (e.g. malformed JSON) to the watchers of `res` (all when None).
    pub fn inject_watch_line(&mut self, res: Option<&ResourceDef>, line: &str) -> usize {
        let mut l = line.as_bytes().to_vec();
        if !l.ends_with(b"\n") {
            l.push(b'\n');
        }
        let line = Bytes::from(l);
        let mut n = 0;
        for w in &self.watchers {
            if res.is_none_or(|r| r.qualified() == w.res.qualified())
                && w.tx.send(WatchMsg::Line(line.clone())).is_ok()
            {
                n += 1;
            }
        }
        n
    }

    /// End the watch streams of `res` (all when None), as an apiserver does on shutdown.
    pub fn close_watches(&mut self, res: Option<&ResourceDef>) -> usize {
        let before = self.watchers.len();
        self.watchers.retain(|w| {
            if res.is_none_or(|r| r.qualified() == w.res.qualified()) {
                let _ = w.tx.send(WatchMsg::Close);
                false
            } else {
                true
            }
        });
        before - self.watchers.len()
    }

    pub fn watcher_count(&self, res: Option<&ResourceDef>) -> usize {
        self.watchers
            .iter()
            .filter(|w| !w.tx.is_closed() && res.is_none_or(|r| r.qualified() == w.res.qualified()))
            .count()
    }
}
