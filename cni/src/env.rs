//! The `CNI_*` environment of one invocation, read through a getter so it is unit-tested.

use std::path::PathBuf;

use crate::config::validate_ifname;
use crate::error::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Status,
    Gc,
    Version,
}

impl Command {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "STATUS" => Command::Status,
            "GC" => Command::Gc,
            "VERSION" => Command::Version,
            _ => return None,
        })
    }
}

/// One invocation's arguments.
#[derive(Clone, Debug)]
pub struct CmdArgs {
    pub command: Command,
    pub container_id: String,
    /// Absent for DEL when the runtime no longer has the namespace.
    pub netns: Option<PathBuf>,
    pub ifname: String,
    pub args: String,
}

impl CmdArgs {
    /// Reads `CNI_COMMAND`, `CNI_CONTAINERID`, `CNI_NETNS`, `CNI_IFNAME`, `CNI_ARGS` and checks
    /// `CNI_PATH` the way libcni's skeleton does: which are required depends on the command.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<CmdArgs> {
        let var = |name: &str| get(name).filter(|v| !v.is_empty());
        let raw =
            var("CNI_COMMAND").ok_or_else(|| Error::InvalidEnv("CNI_COMMAND is missing".into()))?;
        let command = Command::parse(&raw)
            .ok_or_else(|| Error::InvalidEnv(format!("unknown CNI_COMMAND: {raw}")))?;
        let per_container = matches!(command, Command::Add | Command::Del | Command::Check);
        let mut missing = Vec::new();
        let mut need = |name: &'static str, required: bool| {
            let v = var(name);
            if required && v.is_none() {
                missing.push(name);
            }
            v.unwrap_or_default()
        };
        let container_id = need("CNI_CONTAINERID", per_container);
        let netns = need(
            "CNI_NETNS",
            matches!(command, Command::Add | Command::Check),
        );
        let ifname = need("CNI_IFNAME", per_container);
        let args = need("CNI_ARGS", false);
        let _path = need(
            "CNI_PATH",
            per_container || matches!(command, Command::Gc | Command::Status),
        );
        if !missing.is_empty() {
            return Err(Error::InvalidEnv(format!(
                "required env variables missing: {}",
                missing.join(", ")
            )));
        }
        if per_container {
            validate_container_id(&container_id)?;
            validate_ifname(&ifname).map_err(|e| Error::InvalidEnv(format!("CNI_IFNAME: {e}")))?;
        }
        Ok(CmdArgs {
            command,
            container_id,
            netns: (!netns.is_empty()).then(|| PathBuf::from(netns)),
            ifname,
            args,
        })
    }
}

fn validate_container_id(id: &str) -> Result<()> {
    let mut chars = id.chars();
    let ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidEnv(format!(
            "CNI_CONTAINERID {id:?} is not a valid container id"
        )))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn add_needs_its_variables() {
        let err = CmdArgs::from_env(env(&[("CNI_COMMAND", "ADD"), ("CNI_CONTAINERID", "abc")]))
            .unwrap_err();
        assert_eq!(err.code(), 4);
        assert!(err.to_string().contains("CNI_NETNS"), "{err}");
        let ok = CmdArgs::from_env(env(&[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "abc"),
            ("CNI_NETNS", "/run/netns/x"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/opt/cni/bin"),
        ]))
        .unwrap();
        assert_eq!(ok.command, Command::Add);
        assert_eq!(
            ok.netns.as_deref(),
            Some(std::path::Path::new("/run/netns/x"))
        );
    }

    #[test]
    fn del_without_netns_is_fine_and_bad_names_are_refused() {
        let base = [
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "abc"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/b"),
        ];
        let del = CmdArgs::from_env(env(&base)).unwrap();
        assert!(del.netns.is_none());
        let bad_if = CmdArgs::from_env(env(&[
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "abc"),
            ("CNI_IFNAME", "eth0/1"),
            ("CNI_PATH", "/b"),
        ]));
        assert_eq!(bad_if.unwrap_err().code(), 4);
        let bad_id = CmdArgs::from_env(env(&[
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "-x"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/b"),
        ]));
        assert_eq!(bad_id.unwrap_err().code(), 4);
        assert_eq!(
            CmdArgs::from_env(env(&[("CNI_COMMAND", "GET")]))
                .unwrap_err()
                .code(),
            4
        );
        assert_eq!(
            CmdArgs::from_env(env(&[("CNI_COMMAND", "VERSION")]))
                .unwrap()
                .command,
            Command::Version
        );
    }
}
