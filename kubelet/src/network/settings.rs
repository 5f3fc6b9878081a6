//! The node network controller's settings: the `nodeAgentNetwork` KubeletConfiguration field
//! (ours, not upstream's) and the `--node-agent-cni` / `--node-agent-cluster-cidr` flags.
//!
//! ```yaml
//! nodeAgentNetwork:
//!   enabled: true
//!   clusterCIDR: 10.244.0.0/16,fd00:10:244::/56
//!   cniConfDir: /etc/cni/net.d
//!   cniBinDir: /opt/cni/bin
//!   pluginPath: /usr/lib/node-agent/node-agent-cni
//!   mtu: 1500
//!   dataDir: /var/lib/cni/networks
//! ```

use std::path::PathBuf;

use plumbing::cidr::Cidr;
use serde::Serialize;

pub use crate::settings::file::NetworkFileSettings as FileSettings;

/// Where container runtimes read CNI configuration by default (containerd, CRI-O).
pub const DEFAULT_CONF_DIR: &str = "/etc/cni/net.d";
/// Where container runtimes look for CNI plugins by default.
pub const DEFAULT_BIN_DIR: &str = "/opt/cni/bin";
/// The MTU pods get unless `mtu` says otherwise.
pub const DEFAULT_MTU: u32 = 1500;
/// The plugin's executable name (in the bin dir, and beside the kubelet by default).
pub const PLUGIN_NAME: &str = "node-agent-cni";

/// Validated settings.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    pub enabled: bool,
    /// At most one IPv4 and one IPv6 CIDR; empty: pod traffic is not masqueraded.
    #[serde(rename = "clusterCIDRs")]
    pub cluster_cidrs: Vec<Cidr>,
    pub cni_conf_dir: PathBuf,
    pub cni_bin_dir: PathBuf,
    /// The plugin binary to install; `None`: `node-agent-cni` beside the kubelet executable.
    pub plugin_path: Option<PathBuf>,
    pub mtu: u32,
    pub data_dir: PathBuf,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            enabled: false,
            cluster_cidrs: Vec::new(),
            cni_conf_dir: DEFAULT_CONF_DIR.into(),
            cni_bin_dir: DEFAULT_BIN_DIR.into(),
            plugin_path: None,
            mtu: DEFAULT_MTU,
            data_dir: cni::config::DEFAULT_DATA_DIR.into(),
        }
    }
}

/// Parses `a,b` CIDRs: network addresses, at most one per family.
pub fn parse_cidrs(text: &str) -> Result<Vec<Cidr>, String> {
    let mut out: Vec<Cidr> = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let net: Cidr = part
            .parse()
            .map_err(|e| format!("clusterCIDR {part:?}: {e}"))?;
        if net.network() != net {
            return Err(format!(
                "clusterCIDR {part:?} has host bits set (use {})",
                net.network()
            ));
        }
        if out.iter().any(|o| o.is_ipv4() == net.is_ipv4()) {
            return Err("clusterCIDR: at most one IPv4 and one IPv6 CIDR".into());
        }
        out.push(net);
    }
    Ok(out)
}

/// Flags over the file's `nodeAgentNetwork`, defaults applied.
pub fn merge(
    flag_enabled: Option<bool>,
    flag_cluster_cidr: Option<&str>,
    file: Option<&FileSettings>,
) -> Result<Settings, String> {
    let file = file.cloned().unwrap_or_default();
    let d = Settings::default();
    let path = |v: Option<String>, name: &str, def: PathBuf| -> Result<PathBuf, String> {
        match v.filter(|s| !s.is_empty()) {
            None => Ok(def),
            Some(p) if p.starts_with('/') => Ok(PathBuf::from(p)),
            Some(p) => Err(format!(
                "nodeAgentNetwork.{name}: {p:?} must be an absolute path"
            )),
        }
    };
    let mtu = file.mtu.unwrap_or(DEFAULT_MTU);
    if !(68..=65535).contains(&mtu) {
        return Err(format!("nodeAgentNetwork.mtu: {mtu} must be 68..65535"));
    }
    let cidr_text = flag_cluster_cidr
        .map(str::to_string)
        .or(file.cluster_cidr)
        .unwrap_or_default();
    Ok(Settings {
        enabled: flag_enabled.or(file.enabled).unwrap_or(false),
        cluster_cidrs: parse_cidrs(&cidr_text)?,
        cni_conf_dir: path(file.cni_conf_dir, "cniConfDir", d.cni_conf_dir)?,
        cni_bin_dir: path(file.cni_bin_dir, "cniBinDir", d.cni_bin_dir)?,
        plugin_path: match file.plugin_path.filter(|s| !s.is_empty()) {
            None => None,
            Some(p) => Some(path(Some(p), "pluginPath", PathBuf::new())?),
        },
        mtu,
        data_dir: path(file.data_dir, "dataDir", d.data_dir)?,
    })
}
