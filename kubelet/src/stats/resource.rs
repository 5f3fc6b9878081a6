//! `/metrics/resource` in the Prometheus text format, with upstream's metric names, labels and
//! help texts (pkg/kubelet/metrics/collectors/resource_metrics.go); every sample carries the
//! millisecond timestamp of its reading, as metrics-server expects.

use super::summary::{CpuStats, MemoryStats, StatTime, Summary};
use std::fmt::Write;

fn millis(t: &StatTime) -> Option<i64> {
    Some(t.millis())
}

fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

pub(super) struct Family {
    name: &'static str,
    help: &'static str,
    kind: &'static str,
    samples: Vec<String>,
}

impl Family {
    pub(super) fn new(name: &'static str, kind: &'static str, help: &'static str) -> Self {
        Self {
            name,
            help,
            kind,
            samples: Vec::new(),
        }
    }

    pub(super) fn push(&mut self, labels: &[(&str, &str)], value: f64, time: Option<i64>) {
        let mut line = self.name.to_string();
        if !labels.is_empty() {
            let l: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                .collect();
            let _ = write!(line, "{{{}}}", l.join(","));
        }
        let _ = write!(line, " {value}");
        if let Some(t) = time {
            let _ = write!(line, " {t}");
        }
        self.samples.push(line);
    }

    /// Orders the samples by their labels (the Go client's order).
    pub(super) fn sort(&mut self) {
        self.samples.sort();
    }

    pub(super) fn render(&self, out: &mut String) {
        if self.samples.is_empty() {
            return;
        }
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} {}", self.name, self.kind);
        for s in &self.samples {
            let _ = writeln!(out, "{s}");
        }
    }
}

fn cpu_sample(f: &mut Family, labels: &[(&str, &str)], c: Option<&CpuStats>) {
    if let Some(c) = c
        && let Some(ns) = c.usage_core_nano_seconds
    {
        f.push(labels, seconds(ns), millis(&c.time));
    }
}

fn mem_sample(f: &mut Family, labels: &[(&str, &str)], m: Option<&MemoryStats>) {
    if let Some(m) = m
        && let Some(ws) = m.working_set_bytes
    {
        f.push(labels, ws as f64, millis(&m.time));
    }
}

/// The exposition text for `s`; `error`: the refresh failed (`scrape_error` 1).
pub fn render(s: &Summary, error: bool) -> String {
    let mut node_cpu = Family::new(
        "node_cpu_usage_seconds_total",
        "counter",
        "[STABLE] Cumulative cpu time consumed by the node in core-seconds",
    );
    let mut node_mem = Family::new(
        "node_memory_working_set_bytes",
        "gauge",
        "[STABLE] Current working set of the node in bytes",
    );
    let mut pod_cpu = Family::new(
        "pod_cpu_usage_seconds_total",
        "counter",
        "[STABLE] Cumulative cpu time consumed by the pod in core-seconds",
    );
    let mut pod_mem = Family::new(
        "pod_memory_working_set_bytes",
        "gauge",
        "[STABLE] Current working set of the pod in bytes",
    );
    let mut ctr_cpu = Family::new(
        "container_cpu_usage_seconds_total",
        "counter",
        "[STABLE] Cumulative cpu time consumed by the container in core-seconds",
    );
    let mut ctr_mem = Family::new(
        "container_memory_working_set_bytes",
        "gauge",
        "[STABLE] Current working set of the container in bytes",
    );
    let mut ctr_start = Family::new(
        "container_start_time_seconds",
        "gauge",
        "[STABLE] Start time of the container since unix epoch in seconds",
    );
    if !error {
        cpu_sample(&mut node_cpu, &[], s.node.cpu.as_ref());
        mem_sample(&mut node_mem, &[], s.node.memory.as_ref());
    }
    for p in &s.pods {
        let (ns, pod) = (p.pod_ref.namespace.as_str(), p.pod_ref.name.as_str());
        cpu_sample(
            &mut pod_cpu,
            &[("namespace", ns), ("pod", pod)],
            p.cpu.as_ref(),
        );
        mem_sample(
            &mut pod_mem,
            &[("namespace", ns), ("pod", pod)],
            p.memory.as_ref(),
        );
        for c in &p.containers {
            let labels = [
                ("container", c.name.as_str()),
                ("namespace", ns),
                ("pod", pod),
            ];
            cpu_sample(&mut ctr_cpu, &labels, c.cpu.as_ref());
            mem_sample(&mut ctr_mem, &labels, c.memory.as_ref());
            if let Some(ms) = millis(&c.start_time).filter(|ms| *ms > 0) {
                // The time of the reading is the start itself.
                ctr_start.push(&labels, ms as f64 / 1000.0, Some(ms));
            }
        }
    }
    let mut out = String::new();
    for f in [
        &ctr_cpu, &ctr_mem, &ctr_start, &node_cpu, &node_mem, &pod_cpu, &pod_mem,
    ] {
        f.render(&mut out);
    }
    let flag = if error { 1 } else { 0 };
    let _ = writeln!(
        out,
        "# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise\n# TYPE resource_scrape_error gauge\nresource_scrape_error {flag}"
    );
    let _ = writeln!(
        out,
        "# HELP scrape_error [ALPHA] 1 if there was an error while getting container metrics, 0 otherwise\n# TYPE scrape_error gauge\nscrape_error {flag}"
    );
    out
}
