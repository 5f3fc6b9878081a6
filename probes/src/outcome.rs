//! The result of running one probe once (upstream `pkg/probe`'s `probe.Result` + output).

use std::fmt;

/// Upstream `probe.Result`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProbeResult {
    /// The probe passed.
    Success,
    /// The probe passed with a caveat (HTTP: a redirect that was not followed). The prober
    /// treats it as success and upstream records a `ProbeWarning` event.
    Warning,
    /// The probe failed.
    Failure,
    /// The probe could not be run (an error on our side, not the container's); upstream
    /// retries it and then throws the result away.
    Unknown,
}

impl ProbeResult {
    /// Upstream's string form (`probe.Result` is a string type).
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeResult::Success => "success",
            ProbeResult::Warning => "warning",
            ProbeResult::Failure => "failure",
            ProbeResult::Unknown => "unknown",
        }
    }
}

impl fmt::Display for ProbeResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one run of a probe handler produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeOutcome {
    pub result: ProbeResult,
    /// Handler output: the HTTP body, exec output, or a failure/error message.
    pub output: String,
}

impl ProbeOutcome {
    pub fn new(result: ProbeResult, output: impl Into<String>) -> Self {
        ProbeOutcome {
            result,
            output: output.into(),
        }
    }
    pub fn success(output: impl Into<String>) -> Self {
        Self::new(ProbeResult::Success, output)
    }
    pub fn warning(output: impl Into<String>) -> Self {
        Self::new(ProbeResult::Warning, output)
    }
    pub fn failure(output: impl Into<String>) -> Self {
        Self::new(ProbeResult::Failure, output)
    }
    pub fn unknown(output: impl Into<String>) -> Self {
        Self::new(ProbeResult::Unknown, output)
    }
}
