//! A [`Dataplane`] that records what it was asked and keeps the attached pods in memory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::{Attached, Dataplane, PodLink};
use crate::error::{Error, Result};

#[derive(Debug, Default)]
pub struct FakeDataplane {
    /// Attached pods by (netns, ifname).
    pub pods: Mutex<BTreeMap<(PathBuf, String), PodLink>>,
    /// Every call, as `attach <netns> <ifname>` / `detach ...` / `check ...`.
    pub calls: Mutex<Vec<String>>,
    /// When set, `attach` fails with this netlink error.
    pub fail_attach: Mutex<Option<String>>,
}

impl Dataplane for FakeDataplane {
    fn attach(&self, link: &PodLink) -> Result<Attached> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("attach {} {}", link.netns.display(), link.ifname));
        if let Some(msg) = self.fail_attach.lock().unwrap().clone() {
            return Err(Error::Netlink(msg));
        }
        self.pods
            .lock()
            .unwrap()
            .insert((link.netns.clone(), link.ifname.clone()), link.clone());
        Ok(Attached {
            bridge_mac: "02:00:00:00:00:01".into(),
            host_veth_mac: "02:00:00:00:00:02".into(),
            pod_mac: "02:00:00:00:00:03".into(),
        })
    }

    fn detach(&self, netns: Option<&Path>, ifname: &str, _host_veth: &str) -> Result<()> {
        let shown = netns.map(|p| p.display().to_string()).unwrap_or_default();
        self.calls
            .lock()
            .unwrap()
            .push(format!("detach {shown} {ifname}"));
        if let Some(ns) = netns {
            self.pods
                .lock()
                .unwrap()
                .remove(&(ns.to_path_buf(), ifname.to_string()));
        }
        Ok(())
    }

    fn check(&self, link: &PodLink) -> Result<()> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("check {} {}", link.netns.display(), link.ifname));
        match self
            .pods
            .lock()
            .unwrap()
            .get(&(link.netns.clone(), link.ifname.clone()))
        {
            Some(have) if have == link => Ok(()),
            Some(_) => Err(Error::CheckFailed(format!(
                "{} differs from prevResult",
                link.ifname
            ))),
            None => Err(Error::CheckFailed(format!("{} is missing", link.ifname))),
        }
    }
}
