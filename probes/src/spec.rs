//! The probe as the workers use it: built from a k8s-openapi `Probe` plus the container's
//! ports, validated and defaulted like upstream (apiserver defaulting + `validateProbe`,
//! kubelet port resolution).

use std::fmt;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerPort, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::http::HttpGetRequest;
pub use crate::http::Scheme;

/// Upstream defaults (`SetDefaults_Probe`).
pub const DEFAULT_TIMEOUT_SECONDS: i32 = 1;
pub const DEFAULT_PERIOD_SECONDS: i32 = 10;
pub const DEFAULT_SUCCESS_THRESHOLD: i32 = 1;
pub const DEFAULT_FAILURE_THRESHOLD: i32 = 3;

/// Which of a container's probes this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProbeKind {
    Liveness,
    Readiness,
    Startup,
}

impl ProbeKind {
    pub const ALL: [ProbeKind; 3] = [
        ProbeKind::Liveness,
        ProbeKind::Readiness,
        ProbeKind::Startup,
    ];

    /// Upstream's `probeType.String()`, used as the `probe_type` metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeKind::Liveness => "Liveness",
            ProbeKind::Readiness => "Readiness",
            ProbeKind::Startup => "Startup",
        }
    }

    fn field(self) -> &'static str {
        match self {
            ProbeKind::Liveness => "livenessProbe",
            ProbeKind::Readiness => "readinessProbe",
            ProbeKind::Startup => "startupProbe",
        }
    }
}

impl fmt::Display for ProbeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a `Probe` cannot be run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("{probe}: must specify a handler type")]
    NoHandler { probe: &'static str },
    #[error("{probe}: may not specify more than 1 handler type (found {found})")]
    MultipleHandlers { probe: &'static str, found: String },
    #[error("{probe}.exec.command: Required value")]
    EmptyCommand { probe: &'static str },
    #[error("{probe}.{field}: Invalid value: {port}: must be between 1 and 65535, inclusive")]
    PortOutOfRange {
        probe: &'static str,
        field: &'static str,
        port: i64,
    },
    #[error("{probe}.{field}: named port {name:?} not found in the container's ports")]
    UnknownNamedPort {
        probe: &'static str,
        field: &'static str,
        name: String,
    },
    #[error("{probe}.{field}: Invalid value: {value}: must be greater than or equal to 0")]
    Negative {
        probe: &'static str,
        field: &'static str,
        value: i64,
    },
    #[error("{probe}.successThreshold: Invalid value: {value}: must be 1")]
    SuccessThresholdMustBeOne { probe: &'static str, value: i32 },
    #[error(
        "{probe}.terminationGracePeriodSeconds: Invalid value: {value}: must be greater than 0"
    )]
    TerminationGracePeriodNotPositive { probe: &'static str, value: i64 },
    #[error(
        "{probe}.terminationGracePeriodSeconds: Invalid value: must not be set for readinessProbes"
    )]
    TerminationGracePeriodOnReadiness { probe: &'static str },
    #[error(
        "{probe}.httpGet.scheme: Unsupported value: {scheme:?}: supported values: \"HTTP\", \"HTTPS\""
    )]
    UnsupportedScheme { probe: &'static str, scheme: String },
    #[error("{probe}.httpGet.httpHeaders: Invalid value: {name:?}: not a valid HTTP header name")]
    InvalidHeaderName { probe: &'static str, name: String },
}

/// An httpGet handler with its port resolved (the host may still default to the pod IP).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpGetSpec {
    pub scheme: Scheme,
    pub host: Option<String>,
    pub port: u16,
    pub path: String,
    pub headers: Vec<(String, String)>,
}

impl HttpGetSpec {
    /// The request to send, with the host defaulted to `pod_ip`.
    pub fn request(&self, pod_ip: &str) -> HttpGetRequest {
        HttpGetRequest {
            scheme: self.scheme,
            host: self.host.clone().unwrap_or_else(|| pod_ip.to_string()),
            port: self.port,
            path: self.path.clone(),
            headers: self.headers.clone(),
        }
    }
}

/// The one action a probe runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handler {
    Exec {
        command: Vec<String>,
    },
    HttpGet(HttpGetSpec),
    /// `host` defaults to the pod IP.
    TcpSocket {
        host: Option<String>,
        port: u16,
    },
    /// Always dialled at the pod IP; `service` "" asks about the whole server.
    Grpc {
        port: u16,
        service: String,
    },
}

/// A validated, defaulted probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeSpec {
    pub kind: ProbeKind,
    pub handler: Handler,
    pub initial_delay_seconds: u32,
    pub timeout_seconds: u32,
    pub period_seconds: u32,
    pub success_threshold: u32,
    pub failure_threshold: u32,
    /// Probe-level override of the pod's grace period, reported with liveness/startup failures.
    pub termination_grace_period_seconds: Option<i64>,
}

impl ProbeSpec {
    /// Validates `probe` and resolves named ports against the container's `ports`.
    pub fn from_k8s(
        kind: ProbeKind,
        probe: &Probe,
        ports: &[ContainerPort],
    ) -> Result<ProbeSpec, SpecError> {
        let p = kind.field();
        let handler = handler(p, probe, ports)?;

        let non_neg =
            |field: &'static str, v: Option<i32>, default: i32| -> Result<u32, SpecError> {
                match v {
                    Some(v) if v < 0 => Err(SpecError::Negative {
                        probe: p,
                        field,
                        value: i64::from(v),
                    }),
                    // The apiserver defaults a zero (or missing) value.
                    Some(0) | None => Ok(default as u32),
                    Some(v) => Ok(v as u32),
                }
            };
        let initial_delay_seconds = match probe.initial_delay_seconds {
            Some(v) if v < 0 => {
                return Err(SpecError::Negative {
                    probe: p,
                    field: "initialDelaySeconds",
                    value: i64::from(v),
                });
            }
            v => v.unwrap_or(0) as u32,
        };
        let timeout_seconds = non_neg(
            "timeoutSeconds",
            probe.timeout_seconds,
            DEFAULT_TIMEOUT_SECONDS,
        )?;
        let period_seconds = non_neg(
            "periodSeconds",
            probe.period_seconds,
            DEFAULT_PERIOD_SECONDS,
        )?;
        let success_threshold = non_neg(
            "successThreshold",
            probe.success_threshold,
            DEFAULT_SUCCESS_THRESHOLD,
        )?;
        let failure_threshold = non_neg(
            "failureThreshold",
            probe.failure_threshold,
            DEFAULT_FAILURE_THRESHOLD,
        )?;
        if matches!(kind, ProbeKind::Liveness | ProbeKind::Startup) && success_threshold != 1 {
            return Err(SpecError::SuccessThresholdMustBeOne {
                probe: p,
                value: success_threshold as i32,
            });
        }
        let termination_grace_period_seconds = probe.termination_grace_period_seconds;
        if let Some(v) = termination_grace_period_seconds {
            if kind == ProbeKind::Readiness {
                return Err(SpecError::TerminationGracePeriodOnReadiness { probe: p });
            }
            if v <= 0 {
                return Err(SpecError::TerminationGracePeriodNotPositive { probe: p, value: v });
            }
        }
        Ok(ProbeSpec {
            kind,
            handler,
            initial_delay_seconds,
            timeout_seconds,
            period_seconds,
            success_threshold,
            failure_threshold,
            termination_grace_period_seconds,
        })
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_secs(u64::from(self.timeout_seconds))
    }

    pub fn period(&self) -> Duration {
        Duration::from_secs(u64::from(self.period_seconds))
    }
}

fn handler(p: &'static str, probe: &Probe, ports: &[ContainerPort]) -> Result<Handler, SpecError> {
    let mut found = Vec::new();
    if probe.exec.is_some() {
        found.push("exec");
    }
    if probe.http_get.is_some() {
        found.push("httpGet");
    }
    if probe.tcp_socket.is_some() {
        found.push("tcpSocket");
    }
    if probe.grpc.is_some() {
        found.push("grpc");
    }
    match found.len() {
        0 => return Err(SpecError::NoHandler { probe: p }),
        1 => {}
        _ => {
            return Err(SpecError::MultipleHandlers {
                probe: p,
                found: found.join(", "),
            });
        }
    }
    if let Some(exec) = &probe.exec {
        let command = exec.command.clone().unwrap_or_default();
        if command.is_empty() {
            return Err(SpecError::EmptyCommand { probe: p });
        }
        return Ok(Handler::Exec { command });
    }
    if let Some(h) = &probe.http_get {
        let scheme = match h.scheme.as_deref() {
            None | Some("") | Some("HTTP") => Scheme::Http,
            Some("HTTPS") => Scheme::Https,
            Some(other) => {
                return Err(SpecError::UnsupportedScheme {
                    probe: p,
                    scheme: other.to_string(),
                });
            }
        };
        let mut headers = Vec::new();
        for hdr in h.http_headers.iter().flatten() {
            if http::HeaderName::from_bytes(hdr.name.as_bytes()).is_err() {
                return Err(SpecError::InvalidHeaderName {
                    probe: p,
                    name: hdr.name.clone(),
                });
            }
            headers.push((hdr.name.clone(), hdr.value.clone()));
        }
        return Ok(Handler::HttpGet(HttpGetSpec {
            scheme,
            host: h.host.clone().filter(|s| !s.is_empty()),
            port: resolve_port(p, "httpGet.port", &h.port, ports)?,
            path: h
                .path
                .clone()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "/".to_string()),
            headers,
        }));
    }
    if let Some(t) = &probe.tcp_socket {
        return Ok(Handler::TcpSocket {
            host: t.host.clone().filter(|s| !s.is_empty()),
            port: resolve_port(p, "tcpSocket.port", &t.port, ports)?,
        });
    }
    let g = probe.grpc.as_ref().expect("exactly one handler is set");
    Ok(Handler::Grpc {
        port: port_in_range(p, "grpc.port", i64::from(g.port))?,
        service: g.service.clone().unwrap_or_default(),
    })
}

fn port_in_range(p: &'static str, field: &'static str, port: i64) -> Result<u16, SpecError> {
    if (1..=65535).contains(&port) {
        Ok(port as u16)
    } else {
        Err(SpecError::PortOutOfRange {
            probe: p,
            field,
            port,
        })
    }
}

/// Upstream `ResolveContainerPort`: a number, or a name looked up in the container's ports
/// (falling back to a number written as a string).
fn resolve_port(
    p: &'static str,
    field: &'static str,
    port: &IntOrString,
    ports: &[ContainerPort],
) -> Result<u16, SpecError> {
    match port {
        IntOrString::Int(n) => port_in_range(p, field, i64::from(*n)),
        IntOrString::String(name) => {
            if let Some(cp) = ports
                .iter()
                .find(|cp| cp.name.as_deref() == Some(name.as_str()))
            {
                return port_in_range(p, field, i64::from(cp.container_port));
            }
            match name.parse::<i64>() {
                Ok(n) => port_in_range(p, field, n),
                Err(_) => Err(SpecError::UnknownNamedPort {
                    probe: p,
                    field,
                    name: name.clone(),
                }),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ExecAction, GRPCAction, HTTPGetAction, HTTPHeader, TCPSocketAction,
    };

    fn http_probe(port: IntOrString) -> Probe {
        Probe {
            http_get: Some(HTTPGetAction {
                port,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn ports() -> Vec<ContainerPort> {
        vec![ContainerPort {
            name: Some("http".into()),
            container_port: 8080,
            ..Default::default()
        }]
    }

    #[test]
    fn defaults_match_upstream() {
        let s = ProbeSpec::from_k8s(ProbeKind::Readiness, &http_probe(IntOrString::Int(80)), &[])
            .unwrap();
        assert_eq!(s.initial_delay_seconds, 0);
        assert_eq!(s.timeout_seconds, 1);
        assert_eq!(s.period_seconds, 10);
        assert_eq!(s.success_threshold, 1);
        assert_eq!(s.failure_threshold, 3);
        assert_eq!(s.termination_grace_period_seconds, None);
        assert_eq!(
            s.handler,
            Handler::HttpGet(HttpGetSpec {
                scheme: Scheme::Http,
                host: None,
                port: 80,
                path: "/".into(),
                headers: vec![],
            })
        );
    }

    #[test]
    fn explicit_values_kept() {
        let mut p = http_probe(IntOrString::String("http".into()));
        p.initial_delay_seconds = Some(5);
        p.timeout_seconds = Some(2);
        p.period_seconds = Some(3);
        p.success_threshold = Some(2);
        p.failure_threshold = Some(7);
        if let Some(h) = p.http_get.as_mut() {
            h.scheme = Some("HTTPS".into());
            h.path = Some("/healthz?x=1".into());
            h.host = Some("example.internal".into());
            h.http_headers = Some(vec![HTTPHeader {
                name: "X-Probe".into(),
                value: "1".into(),
            }]);
        }
        let s = ProbeSpec::from_k8s(ProbeKind::Readiness, &p, &ports()).unwrap();
        assert_eq!(
            (
                s.initial_delay_seconds,
                s.timeout_seconds,
                s.period_seconds,
                s.success_threshold,
                s.failure_threshold
            ),
            (5, 2, 3, 2, 7)
        );
        let Handler::HttpGet(h) = &s.handler else {
            panic!("not httpGet")
        };
        assert_eq!(h.port, 8080);
        assert_eq!(h.scheme, Scheme::Https);
        let req = h.request("10.1.2.3");
        assert_eq!(req.host, "example.internal");
        assert_eq!(req.url(), "https://example.internal:8080/healthz?x=1");
        assert_eq!(req.headers, vec![("X-Probe".to_string(), "1".to_string())]);
    }

    #[test]
    fn named_port_resolution() {
        let s = ProbeSpec::from_k8s(
            ProbeKind::Liveness,
            &Probe {
                tcp_socket: Some(TCPSocketAction {
                    port: IntOrString::String("http".into()),
                    host: None,
                }),
                ..Default::default()
            },
            &ports(),
        )
        .unwrap();
        assert_eq!(
            s.handler,
            Handler::TcpSocket {
                host: None,
                port: 8080
            }
        );

        // A number written as a string still works (upstream's last-ditch Atoi).
        let s = ProbeSpec::from_k8s(
            ProbeKind::Readiness,
            &http_probe(IntOrString::String("9000".into())),
            &[],
        )
        .unwrap();
        let Handler::HttpGet(h) = s.handler else {
            panic!()
        };
        assert_eq!(h.port, 9000);

        let err = ProbeSpec::from_k8s(
            ProbeKind::Readiness,
            &http_probe(IntOrString::String("metrics".into())),
            &ports(),
        )
        .unwrap_err();
        assert_eq!(
            err,
            SpecError::UnknownNamedPort {
                probe: "readinessProbe",
                field: "httpGet.port",
                name: "metrics".into()
            }
        );
    }

    #[test]
    fn handler_count_errors() {
        let err = ProbeSpec::from_k8s(ProbeKind::Liveness, &Probe::default(), &[]).unwrap_err();
        assert_eq!(
            err,
            SpecError::NoHandler {
                probe: "livenessProbe"
            }
        );
        assert_eq!(
            err.to_string(),
            "livenessProbe: must specify a handler type"
        );

        let mut p = http_probe(IntOrString::Int(80));
        p.exec = Some(ExecAction {
            command: Some(vec!["true".into()]),
        });
        let err = ProbeSpec::from_k8s(ProbeKind::Liveness, &p, &[]).unwrap_err();
        assert_eq!(
            err,
            SpecError::MultipleHandlers {
                probe: "livenessProbe",
                found: "exec, httpGet".into()
            }
        );

        let p = Probe {
            exec: Some(ExecAction {
                command: Some(vec![]),
            }),
            ..Default::default()
        };
        assert_eq!(
            ProbeSpec::from_k8s(ProbeKind::Startup, &p, &[]).unwrap_err(),
            SpecError::EmptyCommand {
                probe: "startupProbe"
            }
        );
    }

    #[test]
    fn port_range_errors() {
        for bad in [0, -1, 65536] {
            let err = ProbeSpec::from_k8s(
                ProbeKind::Readiness,
                &http_probe(IntOrString::Int(bad)),
                &[],
            )
            .unwrap_err();
            assert_eq!(
                err,
                SpecError::PortOutOfRange {
                    probe: "readinessProbe",
                    field: "httpGet.port",
                    port: i64::from(bad)
                }
            );
        }
        let p = Probe {
            grpc: Some(GRPCAction {
                port: 70000,
                service: None,
            }),
            ..Default::default()
        };
        assert!(matches!(
            ProbeSpec::from_k8s(ProbeKind::Readiness, &p, &[]),
            Err(SpecError::PortOutOfRange {
                field: "grpc.port",
                port: 70000,
                ..
            })
        ));
        let mut bad_named = ports();
        bad_named[0].container_port = 0;
        assert!(matches!(
            ProbeSpec::from_k8s(
                ProbeKind::Readiness,
                &http_probe(IntOrString::String("http".into())),
                &bad_named
            ),
            Err(SpecError::PortOutOfRange { port: 0, .. })
        ));
    }

    #[test]
    fn threshold_and_grace_rules() {
        let mut p = http_probe(IntOrString::Int(80));
        p.success_threshold = Some(2);
        assert_eq!(
            ProbeSpec::from_k8s(ProbeKind::Liveness, &p, &[]).unwrap_err(),
            SpecError::SuccessThresholdMustBeOne {
                probe: "livenessProbe",
                value: 2
            }
        );
        assert!(ProbeSpec::from_k8s(ProbeKind::Startup, &p, &[]).is_err());
        assert!(ProbeSpec::from_k8s(ProbeKind::Readiness, &p, &[]).is_ok());

        let mut p = http_probe(IntOrString::Int(80));
        p.termination_grace_period_seconds = Some(5);
        assert_eq!(
            ProbeSpec::from_k8s(ProbeKind::Readiness, &p, &[]).unwrap_err(),
            SpecError::TerminationGracePeriodOnReadiness {
                probe: "readinessProbe"
            }
        );
        assert_eq!(
            ProbeSpec::from_k8s(ProbeKind::Liveness, &p, &[])
                .unwrap()
                .termination_grace_period_seconds,
            Some(5)
        );
        p.termination_grace_period_seconds = Some(0);
        assert!(matches!(
            ProbeSpec::from_k8s(ProbeKind::Liveness, &p, &[]),
            Err(SpecError::TerminationGracePeriodNotPositive { value: 0, .. })
        ));

        let mut p = http_probe(IntOrString::Int(80));
        p.period_seconds = Some(-1);
        assert_eq!(
            ProbeSpec::from_k8s(ProbeKind::Readiness, &p, &[]).unwrap_err(),
            SpecError::Negative {
                probe: "readinessProbe",
                field: "periodSeconds",
                value: -1
            }
        );
    }

    #[test]
    fn scheme_and_header_errors() {
        let mut p = http_probe(IntOrString::Int(80));
        p.http_get.as_mut().unwrap().scheme = Some("FTP".into());
        assert!(matches!(
            ProbeSpec::from_k8s(ProbeKind::Readiness, &p, &[]),
            Err(SpecError::UnsupportedScheme { .. })
        ));
        let mut p = http_probe(IntOrString::Int(80));
        p.http_get.as_mut().unwrap().http_headers = Some(vec![HTTPHeader {
            name: "bad header".into(),
            value: "x".into(),
        }]);
        assert!(matches!(
            ProbeSpec::from_k8s(ProbeKind::Readiness, &p, &[]),
            Err(SpecError::InvalidHeaderName { .. })
        ));
    }
}
