//! The ADD result (and the `prevResult` the runtime hands back for CHECK and DEL), in the
//! spec's JSON for each supported version: 0.3.x/0.4.0 carry `"version"` in each IP entry,
//! 1.x dropped it.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use plumbing::cidr::Cidr;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interface {
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sandbox: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpConfig {
    pub address: Cidr,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    /// Index into `interfaces`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    pub dst: Cidr,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
}

/// The spec's DNS dictionary; the plugin echoes the config's `dns` into its result.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub domain: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

/// A plugin result: what ADD prints and what CHECK/DEL receive as `prevResult`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CniResult {
    #[serde(default)]
    pub interfaces: Vec<Interface>,
    #[serde(default)]
    pub ips: Vec<IpConfig>,
    #[serde(default)]
    pub routes: Vec<Route>,
    #[serde(default)]
    pub dns: Dns,
}

pub type PrevResult = CniResult;

impl CniResult {
    /// The result JSON in the config's `cni_version`.
    pub fn to_json(&self, cni_version: &str) -> String {
        let legacy = matches!(cni_version, "0.3.0" | "0.3.1" | "0.4.0");
        let ips: Vec<Value> = self
            .ips
            .iter()
            .map(|ip| {
                let mut v = serde_json::to_value(ip).unwrap_or(Value::Null);
                if legacy && let Value::Object(map) = &mut v {
                    let family = if ip.address.is_ipv4() { "4" } else { "6" };
                    map.insert("version".into(), Value::String(family.into()));
                }
                v
            })
            .collect();
        let out = json!({
            "cniVersion": cni_version,
            "interfaces": self.interfaces,
            "ips": ips,
            "routes": self.routes,
            "dns": self.dns,
        });
        out.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CniResult {
        CniResult {
            interfaces: vec![
                Interface {
                    name: "cni0".into(),
                    mac: "aa:bb:cc:dd:ee:01".into(),
                    sandbox: String::new(),
                },
                Interface {
                    name: "veth1234".into(),
                    mac: "aa:bb:cc:dd:ee:02".into(),
                    sandbox: String::new(),
                },
                Interface {
                    name: "eth0".into(),
                    mac: "aa:bb:cc:dd:ee:03".into(),
                    sandbox: "/var/run/netns/p".into(),
                },
            ],
            ips: vec![IpConfig {
                address: "10.244.1.2/24".parse().unwrap(),
                gateway: Some("10.244.1.1".parse().unwrap()),
                interface: Some(2),
            }],
            routes: vec![Route {
                dst: "0.0.0.0/0".parse().unwrap(),
                gw: Some("10.244.1.1".parse().unwrap()),
            }],
            dns: Dns::default(),
        }
    }

    #[test]
    fn v1_result_has_the_spec_shape() {
        let v: Value = serde_json::from_str(&sample().to_json("1.0.0")).unwrap();
        assert_eq!(
            v,
            json!({
                "cniVersion": "1.0.0",
                "interfaces": [
                    {"name": "cni0", "mac": "aa:bb:cc:dd:ee:01"},
                    {"name": "veth1234", "mac": "aa:bb:cc:dd:ee:02"},
                    {"name": "eth0", "mac": "aa:bb:cc:dd:ee:03", "sandbox": "/var/run/netns/p"}
                ],
                "ips": [{"address": "10.244.1.2/24", "gateway": "10.244.1.1", "interface": 2}],
                "routes": [{"dst": "0.0.0.0/0", "gw": "10.244.1.1"}],
                "dns": {}
            })
        );
    }

    #[test]
    fn legacy_results_carry_the_ip_version_and_parse_back() {
        let text = sample().to_json("0.4.0");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["ips"][0]["version"], "4");
        let back: CniResult = serde_json::from_str(&text).unwrap();
        assert_eq!(back, sample());
    }
}
