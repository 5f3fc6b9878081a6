//! The kubelet's side of the `probes` crate: exec probes run through the CRI's ExecSync, and
//! failed probes become `Unhealthy` events.

use crate::events::{EventRecorder, EventType};
use crate::runtime::{Runtime, RuntimeError};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::ObjectReference;
use probes::{ExecError, ExecOutput, ExecRunner};
use std::sync::Arc;
use std::time::Duration;

/// Runs exec probes with CRI ExecSync.
pub struct CriExec(pub Arc<dyn Runtime>);

impl ExecRunner for CriExec {
    fn exec_sync(
        &self,
        container_id: &str,
        cmd: &[String],
        timeout: Duration,
    ) -> BoxFuture<'_, Result<ExecOutput, ExecError>> {
        let id = container_id.to_string();
        let cmd = cmd.to_vec();
        Box::pin(async move {
            match self.0.exec_sync(&id, &cmd, timeout).await {
                Ok(r) => Ok(ExecOutput {
                    exit_code: r.exit_code,
                    stdout: r.stdout,
                    stderr: r.stderr,
                }),
                // The runtime enforces the timeout and reports it as DeadlineExceeded.
                Err(RuntimeError::Call { message, .. })
                    if message.starts_with("DeadlineExceeded") =>
                {
                    Err(ExecError::Timeout {
                        command: cmd.join(" "),
                    })
                }
                Err(e) => Err(ExecError::Runtime(e.to_string())),
            }
        })
    }
}

/// Turns failed probes into `Unhealthy` events and warnings into `ProbeWarning` events.
pub struct ProbeEvents(pub Arc<dyn EventRecorder>);

fn container_ref(pod: &probes::PodRef, container: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(pod.namespace.clone()),
        name: Some(pod.name.clone()),
        uid: Some(pod.uid.clone()),
        field_path: Some(format!("spec.containers{{{container}}}")),
        ..Default::default()
    }
}

impl probes::ProbeEvents for ProbeEvents {
    fn probe_failed(
        &self,
        pod: &probes::PodRef,
        container: &str,
        kind: probes::ProbeKind,
        output: &str,
    ) {
        let message = format!("{kind} probe failed: {output}");
        self.0.record(
            &container_ref(pod, container),
            EventType::Warning,
            "Unhealthy",
            &message,
        );
    }

    fn probe_warning(
        &self,
        pod: &probes::PodRef,
        container: &str,
        kind: probes::ProbeKind,
        output: &str,
    ) {
        let message = format!("{kind} probe warning: {output}");
        self.0.record(
            &container_ref(pod, container),
            EventType::Warning,
            "ProbeWarning",
            &message,
        );
    }
}
