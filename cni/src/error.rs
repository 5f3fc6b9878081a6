//! CNI errors: every failure maps to one of the spec's well-known codes and is printed as the
//! spec's error JSON (`{"cniVersion","code","msg","details"}`).

use serde::Serialize;

/// A failed CNI command. The variant decides the spec's error code.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Code 1: the config's `cniVersion` (or the command for it) is not supported.
    #[error("incompatible CNI versions: {0}")]
    IncompatibleVersion(String),
    /// Code 2: a config field this plugin does not implement.
    #[error("unsupported field: {0}")]
    UnsupportedField(String),
    /// Code 3: the container is unknown or does not exist.
    #[error("unknown container: {0}")]
    UnknownContainer(String),
    /// Code 4: a missing or invalid `CNI_*` environment variable.
    #[error("invalid environment variables: {0}")]
    InvalidEnv(String),
    /// Code 5: reading or writing a file failed.
    #[error("I/O failure: {0}")]
    Io(String),
    /// Code 6: stdin is not valid JSON of the expected shape.
    #[error("decoding failure: {0}")]
    Decode(String),
    /// Code 7: the network configuration is invalid.
    #[error("invalid network config: {0}")]
    InvalidConfig(String),
    /// Code 11: a transient condition; the runtime should retry.
    #[error("try again later: {0}")]
    TryAgainLater(String),
    /// Code 50: STATUS: the plugin cannot serve ADD now.
    #[error("plugin not available: {0}")]
    NotAvailable(String),
    /// Code 100 (plugin-specific): the subnet has no free address.
    #[error("no free address in {0}")]
    Exhausted(String),
    /// Code 101 (plugin-specific): CHECK found the interface, address or route missing.
    #[error("check failed: {0}")]
    CheckFailed(String),
    /// Code 999 (the spec's internal error): a netlink call failed.
    #[error("netlink: {0}")]
    Netlink(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn code(&self) -> u32 {
        match self {
            Error::IncompatibleVersion(_) => 1,
            Error::UnsupportedField(_) => 2,
            Error::UnknownContainer(_) => 3,
            Error::InvalidEnv(_) => 4,
            Error::Io(_) => 5,
            Error::Decode(_) => 6,
            Error::InvalidConfig(_) => 7,
            Error::TryAgainLater(_) => 11,
            Error::NotAvailable(_) => 50,
            Error::Exhausted(_) => 100,
            Error::CheckFailed(_) => 101,
            Error::Netlink(_) => 999,
        }
    }

    /// The short message (`msg`) and the long one (`details`).
    fn msg_and_details(&self) -> (&'static str, String) {
        let msg = match self {
            Error::IncompatibleVersion(_) => "incompatible CNI versions",
            Error::UnsupportedField(_) => "unsupported field",
            Error::UnknownContainer(_) => "unknown container",
            Error::InvalidEnv(_) => "invalid environment variables",
            Error::Io(_) => "I/O failure",
            Error::Decode(_) => "failed to decode content",
            Error::InvalidConfig(_) => "invalid network config",
            Error::TryAgainLater(_) => "try again later",
            Error::NotAvailable(_) => "plugin not available",
            Error::Exhausted(_) => "no free IP address",
            Error::CheckFailed(_) => "check failed",
            Error::Netlink(_) => "netlink request failed",
        };
        let details = match self {
            Error::IncompatibleVersion(d)
            | Error::UnsupportedField(d)
            | Error::UnknownContainer(d)
            | Error::InvalidEnv(d)
            | Error::Io(d)
            | Error::Decode(d)
            | Error::InvalidConfig(d)
            | Error::TryAgainLater(d)
            | Error::NotAvailable(d)
            | Error::Exhausted(d)
            | Error::CheckFailed(d)
            | Error::Netlink(d) => d.clone(),
        };
        (msg, details)
    }

    /// The spec's error JSON for this error, answered in `cni_version`.
    pub fn to_json(&self, cni_version: &str) -> String {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Wire<'a> {
            cni_version: &'a str,
            code: u32,
            msg: &'a str,
            #[serde(skip_serializing_if = "str::is_empty")]
            details: &'a str,
        }
        let (msg, details) = self.msg_and_details();
        let wire = Wire {
            cni_version,
            code: self.code(),
            msg,
            details: &details,
        };
        serde_json::to_string(&wire).unwrap_or_else(|_| format!("{{\"code\":{}}}", self.code()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_json_has_the_spec_fields() {
        let e = Error::InvalidConfig("bridge name too long".into());
        let v: serde_json::Value = serde_json::from_str(&e.to_json("1.0.0")).unwrap();
        assert_eq!(v["cniVersion"], "1.0.0");
        assert_eq!(v["code"], 7);
        assert_eq!(v["msg"], "invalid network config");
        assert_eq!(v["details"], "bridge name too long");
        assert_eq!(Error::IncompatibleVersion(String::new()).code(), 1);
        assert_eq!(Error::TryAgainLater(String::new()).code(), 11);
    }
}
