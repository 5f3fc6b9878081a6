//! The error of reading and resolving the kubelet's settings.

/// Why the configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("parsing config file {path}: {message}")]
    Parse { path: String, message: String },
    #[error("invalid configuration: {0}")]
    Invalid(String),
    /// Security-relevant settings set to values whose behaviour the agent does not provide.
    #[error("refusing to start: {}", .0.join("; "))]
    Refused(Vec<String>),
}
