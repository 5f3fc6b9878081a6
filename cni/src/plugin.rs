//! One plugin invocation: environment + stdin in, stdout text and exit code out.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::config::{self, CURRENT_VERSION, NetConf, SUPPORTED_VERSIONS};
use crate::dataplane::{Dataplane, PodLink, host_veth_name};
use crate::env::{CmdArgs, Command};
use crate::error::{Error, Result};
use crate::ipam::Store;
use crate::result::{CniResult, Interface, IpConfig, Route};
use plumbing::cidr::Cidr;

/// What the binary prints and how it exits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Output {
    pub stdout: String,
    pub exit_code: i32,
}

/// Runs one command. Errors become the spec's error JSON and exit code 1.
pub fn run(
    env: impl Fn(&str) -> Option<String>,
    stdin: &[u8],
    dataplane: &dyn Dataplane,
) -> Output {
    let peeked = config::peek_version(stdin);
    let reply_version = if SUPPORTED_VERSIONS.contains(&peeked.as_str()) {
        peeked.as_str()
    } else {
        CURRENT_VERSION
    };
    match dispatch(env, stdin, dataplane) {
        Ok(stdout) => Output {
            stdout,
            exit_code: 0,
        },
        Err(e) => {
            tracing::warn!(code = e.code(), "{e}");
            Output {
                stdout: e.to_json(reply_version),
                exit_code: 1,
            }
        }
    }
}

fn dispatch(
    env: impl Fn(&str) -> Option<String>,
    stdin: &[u8],
    dataplane: &dyn Dataplane,
) -> Result<String> {
    let args = CmdArgs::from_env(env)?;
    if args.command == Command::Version {
        return Ok(version_json());
    }
    let conf = NetConf::parse(stdin)?;
    let floor = match args.command {
        Command::Check => Some(("CHECK", "0.4.0")),
        Command::Status => Some(("STATUS", "1.1.0")),
        Command::Gc => Some(("GC", "1.1.0")),
        _ => None,
    };
    if let Some((name, floor)) = floor
        && config::version_at_least(&conf.cni_version, floor) != Some(true)
    {
        return Err(Error::IncompatibleVersion(format!(
            "config version does not allow {name}"
        )));
    }
    match args.command {
        Command::Add => add(&args, &conf, dataplane).map(|r| r.to_json(&conf.cni_version)),
        Command::Del => del(&args, &conf, dataplane).map(|()| String::new()),
        Command::Check => check(&args, &conf, dataplane).map(|()| String::new()),
        Command::Status => status(&conf).map(|()| String::new()),
        Command::Gc => gc(&conf).map(|()| String::new()),
        Command::Version => Ok(version_json()),
    }
}

/// VERSION's answer.
pub fn version_json() -> String {
    serde_json::json!({"cniVersion": CURRENT_VERSION, "supportedVersions": SUPPORTED_VERSIONS})
        .to_string()
}

/// The bridge's address on a subnet: its first address.
fn gateway(subnet: &Cidr) -> Cidr {
    Cidr {
        addr: subnet.nth(1).unwrap_or(subnet.addr),
        prefix: subnet.prefix,
    }
}

fn default_route(gw: IpAddr) -> Route {
    let any = if gw.is_ipv4() {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    } else {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    };
    Route {
        dst: Cidr {
            addr: any,
            prefix: 0,
        },
        gw: Some(gw),
    }
}

fn add(args: &CmdArgs, conf: &NetConf, dataplane: &dyn Dataplane) -> Result<CniResult> {
    if conf.prev_result.is_some() {
        return Err(Error::UnsupportedField(
            "prevResult on ADD: node-agent-cni creates the interface and must be the first plugin in the list".into(),
        ));
    }
    let netns = args
        .netns
        .clone()
        .ok_or_else(|| Error::InvalidEnv("CNI_NETNS is missing".into()))?;
    let store = Store::new(&conf.data_dir);
    let addresses = store
        .lock()?
        .allocate(&args.container_id, &args.ifname, &conf.subnets)?;
    let gateways: Vec<Cidr> = conf.subnets.iter().map(gateway).collect();
    let routes: Vec<Route> = gateways.iter().map(|g| default_route(g.addr)).collect();
    let link = PodLink {
        bridge: conf.bridge.clone(),
        mtu: conf.mtu,
        gateways: gateways.clone(),
        netns: netns.clone(),
        ifname: args.ifname.clone(),
        host_veth: host_veth_name(&args.container_id, &args.ifname),
        addresses: addresses.clone(),
        routes: routes.clone(),
    };
    let attached = match dataplane.attach(&link) {
        Ok(a) => a,
        Err(e) => {
            if let Ok(lock) = store.lock() {
                let _ = lock.release(&args.container_id, &args.ifname);
            }
            return Err(e);
        }
    };
    tracing::info!(container = %args.container_id, ?addresses, "attached");
    Ok(CniResult {
        interfaces: vec![
            Interface {
                name: conf.bridge.clone(),
                mac: attached.bridge_mac,
                sandbox: String::new(),
            },
            Interface {
                name: link.host_veth.clone(),
                mac: attached.host_veth_mac,
                sandbox: String::new(),
            },
            Interface {
                name: args.ifname.clone(),
                mac: attached.pod_mac,
                sandbox: netns.display().to_string(),
            },
        ],
        ips: addresses
            .iter()
            .zip(&gateways)
            .map(|(a, g)| IpConfig {
                address: *a,
                gateway: Some(g.addr),
                interface: Some(2),
            })
            .collect(),
        routes,
        dns: conf.dns.clone(),
    })
}

fn del(args: &CmdArgs, conf: &NetConf, dataplane: &dyn Dataplane) -> Result<()> {
    let host_veth = host_veth_name(&args.container_id, &args.ifname);
    dataplane.detach(args.netns.as_deref(), &args.ifname, &host_veth)?;
    let freed = Store::new(&conf.data_dir)
        .lock()?
        .release(&args.container_id, &args.ifname)?;
    tracing::info!(container = %args.container_id, ?freed, "detached");
    Ok(())
}

fn check(args: &CmdArgs, conf: &NetConf, dataplane: &dyn Dataplane) -> Result<()> {
    let prev = conf
        .prev_result()?
        .ok_or_else(|| Error::InvalidConfig("CHECK needs prevResult".into()))?;
    let netns = args
        .netns
        .clone()
        .ok_or_else(|| Error::InvalidEnv("CNI_NETNS is missing".into()))?;
    let pod_index = prev
        .interfaces
        .iter()
        .position(|i| i.name == args.ifname && !i.sandbox.is_empty())
        .ok_or_else(|| {
            Error::CheckFailed(format!(
                "prevResult has no sandbox interface {}",
                args.ifname
            ))
        })?;
    let addresses: Vec<Cidr> = prev
        .ips
        .iter()
        .filter(|ip| ip.interface == Some(pod_index))
        .map(|ip| ip.address)
        .collect();
    let held =
        Store::new(&conf.data_dir)
            .lock()?
            .get(&args.container_id, &args.ifname, &conf.subnets)?;
    if let Some(a) = addresses.iter().find(|a| !held.contains(a)) {
        return Err(Error::CheckFailed(format!(
            "{a} is not allocated to container {}",
            args.container_id
        )));
    }
    let link = PodLink {
        bridge: conf.bridge.clone(),
        mtu: conf.mtu,
        gateways: conf.subnets.iter().map(gateway).collect(),
        netns,
        ifname: args.ifname.clone(),
        host_veth: host_veth_name(&args.container_id, &args.ifname),
        addresses,
        routes: prev.routes.clone(),
    };
    dataplane.check(&link)
}

fn status(conf: &NetConf) -> Result<()> {
    let store = Store::new(&conf.data_dir);
    let lock = store
        .lock()
        .map_err(|e| Error::NotAvailable(e.to_string()))?;
    if lock.has_free(&conf.subnets)? {
        Ok(())
    } else {
        Err(Error::NotAvailable(format!(
            "no free address in {:?}",
            conf.subnets
        )))
    }
}

fn gc(conf: &NetConf) -> Result<()> {
    let valid = conf
        .valid_attachments
        .as_ref()
        .ok_or_else(|| Error::InvalidConfig("GC needs cni.dev/valid-attachments".into()))?;
    let freed = Store::new(&conf.data_dir).lock()?.retain(valid)?;
    tracing::info!(?freed, "garbage collected");
    Ok(())
}

#[cfg(test)]
mod tests;
