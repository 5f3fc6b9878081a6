//! The plugin's network configuration (stdin), validated into [`NetConf`].
//!
//! ```json
//! {"cniVersion":"1.0.0","name":"k8s-pod-network","type":"node-agent-cni","bridge":"cni0",
//!  "mtu":1500,"ipam":{"subnet":"10.244.1.0/24"},"dataDir":"/var/lib/cni/networks"}
//! ```
//! Dual-stack: `"ipam":{"subnets":["10.244.1.0/24","fd00:10:244:1::/64"]}`. A field the plugin
//! does not implement is refused (code 2), never silently ignored.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::result::{Dns, PrevResult};
use plumbing::cidr::Cidr;

/// Versions of the CNI spec this plugin speaks (0.1.0/0.2.0 had a different result format).
pub const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];
/// The newest version: the one VERSION answers in.
pub const CURRENT_VERSION: &str = "1.1.0";
pub const DEFAULT_BRIDGE: &str = "cni0";
pub const DEFAULT_MTU: u32 = 1500;
/// Where allocations live unless `dataDir` says otherwise (host-local's default), one
/// directory per network name.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/networks";

/// Keys the runtime adds or that carry data plugins may ignore (the spec's `args`, libcni's
/// `runtimeConfig`/`capabilities`, CNI 1.1's GC list).
const PASS_THROUGH_KEYS: &[&str] = &[
    "args",
    "runtimeConfig",
    "capabilities",
    "disableCheck",
    "disableGC",
    "cni.dev/attachments",
];

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawConf {
    cni_version: Option<String>,
    name: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    bridge: Option<String>,
    mtu: Option<u32>,
    ipam: Option<RawIpam>,
    data_dir: Option<PathBuf>,
    dns: Option<Dns>,
    prev_result: Option<Value>,
    ip_masq: Option<bool>,
    #[serde(rename = "cni.dev/valid-attachments")]
    valid_attachments: Option<Vec<Attachment>>,
    #[serde(flatten)]
    rest: BTreeMap<String, Value>,
}

#[derive(Debug, Deserialize)]
struct RawIpam {
    subnet: Option<Cidr>,
    subnets: Option<Vec<Cidr>>,
    #[serde(rename = "type")]
    kind: Option<String>,
    #[serde(flatten)]
    rest: BTreeMap<String, Value>,
}

/// One attachment the runtime still uses (CNI 1.1 GC).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

/// A validated network configuration.
#[derive(Clone, Debug)]
pub struct NetConf {
    pub cni_version: String,
    pub name: String,
    pub bridge: String,
    pub mtu: u32,
    /// The node's pod subnets: at most one IPv4 and one IPv6.
    pub subnets: Vec<Cidr>,
    /// The network's allocation directory (`<dataDir>/<name>`).
    pub data_dir: PathBuf,
    pub dns: Dns,
    /// The previous result, as the runtime passed it.
    pub prev_result: Option<Value>,
    pub valid_attachments: Option<Vec<Attachment>>,
}

/// The `cniVersion` of a config, read before anything else so errors can answer in it.
/// A config without one is 0.1.0, as libcni reads it.
pub fn peek_version(stdin: &[u8]) -> String {
    #[derive(Deserialize)]
    struct Peek {
        #[serde(rename = "cniVersion")]
        cni_version: Option<String>,
    }
    serde_json::from_slice::<Peek>(stdin)
        .ok()
        .and_then(|p| p.cni_version)
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "0.1.0".to_string())
}

/// Fails with code 1 unless this plugin speaks `version`.
pub fn check_supported(version: &str) -> Result<()> {
    if SUPPORTED_VERSIONS.contains(&version) {
        Ok(())
    } else {
        Err(Error::IncompatibleVersion(format!(
            "config is \"{version}\", plugin supports {SUPPORTED_VERSIONS:?}"
        )))
    }
}

/// `a >= b` for `major.minor.patch` versions; `None` if either does not parse.
pub fn version_at_least(a: &str, b: &str) -> Option<bool> {
    fn parse(v: &str) -> Option<(u32, u32, u32)> {
        let mut it = v.split('.').map(|p| p.parse::<u32>().ok());
        let t = (it.next()??, it.next()??, it.next()??);
        it.next().is_none().then_some(t)
    }
    Some(parse(a)? >= parse(b)?)
}

impl NetConf {
    /// `prevResult` decoded (code 6 if it is not a result).
    pub fn prev_result(&self) -> Result<Option<PrevResult>> {
        self.prev_result
            .as_ref()
            .map(|v| {
                serde_json::from_value(v.clone())
                    .map_err(|e| Error::Decode(format!("prevResult: {e}")))
            })
            .transpose()
    }

    /// Parses and validates the stdin config.
    pub fn parse(stdin: &[u8]) -> Result<NetConf> {
        let raw: RawConf = serde_json::from_slice(stdin)
            .map_err(|e| Error::Decode(format!("network config: {e}")))?;
        let cni_version = raw
            .cni_version
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| "0.1.0".into());
        check_supported(&cni_version)?;
        let name = raw.name.unwrap_or_default();
        if name.is_empty() {
            return Err(Error::InvalidConfig("missing network name".into()));
        }
        if !valid_network_name(&name) {
            return Err(Error::InvalidConfig(format!(
                "network name {name:?}: must start with a letter or digit, then letters, digits, '_', '.' or '-'"
            )));
        }
        let _ = raw.kind;
        if let Some(key) = raw
            .rest
            .keys()
            .find(|k| !PASS_THROUGH_KEYS.contains(&k.as_str()))
        {
            return Err(Error::UnsupportedField(format!(
                "{key:?} is not a node-agent-cni setting"
            )));
        }
        if raw.ip_masq == Some(true) {
            return Err(Error::UnsupportedField(
                "ipMasq: the node agent's controller masquerades pod traffic; the plugin does not"
                    .into(),
            ));
        }
        let bridge = raw.bridge.unwrap_or_else(|| DEFAULT_BRIDGE.to_string());
        validate_ifname(&bridge).map_err(|e| Error::InvalidConfig(format!("bridge: {e}")))?;
        let mtu = raw.mtu.unwrap_or(DEFAULT_MTU);
        if !(68..=65535).contains(&mtu) {
            return Err(Error::InvalidConfig(format!(
                "mtu {mtu}: must be 68..65535"
            )));
        }
        let subnets = parse_ipam(raw.ipam)?;
        let data_dir = raw
            .data_dir
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR))
            .join(&name);
        // Decoded only by the command that reads it (CHECK): DEL must not fail on it.
        let prev_result = raw.prev_result.filter(|v| !v.is_null());
        Ok(NetConf {
            cni_version,
            name,
            bridge,
            mtu,
            subnets,
            data_dir,
            dns: raw.dns.unwrap_or_default(),
            prev_result,
            valid_attachments: raw.valid_attachments,
        })
    }
}

fn parse_ipam(ipam: Option<RawIpam>) -> Result<Vec<Cidr>> {
    let ipam =
        ipam.ok_or_else(|| Error::InvalidConfig("ipam: missing (needs subnet or subnets)".into()))?;
    if let Some(kind) = ipam.kind {
        return Err(Error::UnsupportedField(format!(
            "ipam.type {kind:?}: node-agent-cni allocates addresses itself; remove ipam.type"
        )));
    }
    if let Some(key) = ipam.rest.keys().next() {
        return Err(Error::UnsupportedField(format!(
            "ipam.{key} is not a node-agent-cni setting"
        )));
    }
    let subnets = match (ipam.subnet, ipam.subnets) {
        (Some(_), Some(_)) => {
            return Err(Error::InvalidConfig(
                "ipam: set subnet or subnets, not both".into(),
            ));
        }
        (Some(one), None) => vec![one],
        (None, Some(many)) if !many.is_empty() => many,
        _ => return Err(Error::InvalidConfig("ipam: no subnet".into())),
    };
    if subnets.len() > 2 || (subnets.len() == 2 && subnets[0].is_ipv4() == subnets[1].is_ipv4()) {
        return Err(Error::InvalidConfig(
            "ipam.subnets: at most one IPv4 and one IPv6 subnet".into(),
        ));
    }
    for s in &subnets {
        if s.network() != *s {
            return Err(Error::InvalidConfig(format!(
                "subnet {s} has host bits set (use {})",
                s.network()
            )));
        }
        let max = if s.is_ipv4() { 30 } else { 126 };
        if s.prefix > max {
            return Err(Error::InvalidConfig(format!(
                "subnet {s} is too small for a gateway and pods"
            )));
        }
    }
    Ok(subnets)
}

fn valid_network_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// Linux interface name rules (as libcni validates `CNI_IFNAME`).
pub fn validate_ifname(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("interface name is empty".into());
    }
    if name.len() > 15 {
        return Err(format!(
            "interface name {name:?} is longer than 15 characters"
        ));
    }
    if name == "." || name == ".." {
        return Err(format!("interface name {name:?} is not allowed"));
    }
    if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        return Err(format!(
            "interface name {name:?} contains '/', ':' or whitespace"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
