//! [`FakeLinks`]: the dummy interface's rtnetlink edge in memory, recording every request and
//! answering with an injected errno where a test asks for one.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use plumbing::rtnl::rtnetlink::packet_route::address::AddressMessage;
use plumbing::rtnl::rtnetlink::packet_route::link::{LinkAttribute, LinkMessage};

use super::{Links, listed_address};
use crate::model::IpFamily;
use crate::netlink::{EADDRNOTAVAIL, EEXIST, ENODEV, NlError};

/// A request the fake received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    LinkIndex(String),
    AddLink(LinkMessage),
    DeleteLink(u32),
    Addresses(IpFamily),
    AddAddress(AddressMessage),
    DeleteAddress(AddressMessage),
}

/// Which request an injected errno answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Request {
    AddLink,
    AddAddress,
    DeleteAddress,
}

#[derive(Debug, Default)]
struct State {
    links: BTreeMap<String, u32>,
    /// (link index, address, as the kernel lists it).
    addrs: Vec<AddressMessage>,
    calls: Vec<Call>,
    fail: BTreeMap<Request, i32>,
}

/// Links and addresses in memory (see the module's text).
#[derive(Clone, Debug, Default)]
pub struct FakeLinks {
    st: Arc<Mutex<State>>,
}

fn kernel(what: &str, errno: i32) -> NlError {
    NlError::Kernel {
        what: what.into(),
        errno,
    }
}

impl FakeLinks {
    pub fn new() -> Self {
        Self::default()
    }

    fn st(&self) -> std::sync::MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A link that exists already.
    pub fn with_link(self, name: &str, index: u32) -> Self {
        self.st().links.insert(name.into(), index);
        self
    }

    /// An address the kernel lists, as it would list it.
    pub fn with_listed(self, msg: AddressMessage) -> Self {
        self.st().addrs.push(msg);
        self
    }

    /// `request` answers `errno` from now on.
    pub fn fail(&self, request: Request, errno: i32) {
        self.st().fail.insert(request, errno);
    }

    pub fn calls(&self) -> Vec<Call> {
        std::mem::take(&mut self.st().calls)
    }

    pub fn addresses_on(&self, index: u32) -> Vec<IpAddr> {
        self.st()
            .addrs
            .iter()
            .filter_map(listed_address)
            .filter(|(i, _)| *i == index)
            .map(|(_, ip)| ip)
            .collect()
    }

    fn call(&self, c: Call, request: Option<Request>, what: &str) -> Result<(), NlError> {
        let mut st = self.st();
        st.calls.push(c);
        match request.and_then(|r| st.fail.get(&r)) {
            Some(errno) => Err(kernel(what, *errno)),
            None => Ok(()),
        }
    }
}

impl Links for FakeLinks {
    async fn link_index(&self, name: &str) -> Result<Option<u32>, NlError> {
        self.call(Call::LinkIndex(name.into()), None, "get link")?;
        Ok(self.st().links.get(name).copied())
    }

    async fn add_link(&self, what: &str, msg: LinkMessage) -> Result<(), NlError> {
        self.call(Call::AddLink(msg.clone()), Some(Request::AddLink), what)?;
        let name = msg.attributes.iter().find_map(|a| match a {
            LinkAttribute::IfName(n) => Some(n.clone()),
            _ => None,
        });
        let mut st = self.st();
        let name = name.ok_or_else(|| kernel(what, 22))?;
        if st.links.contains_key(&name) {
            return Err(kernel(what, EEXIST));
        }
        let index = st.links.values().max().map_or(10, |m| m + 1);
        st.links.insert(name, index);
        Ok(())
    }

    async fn delete_link(&self, what: &str, index: u32) -> Result<(), NlError> {
        self.call(Call::DeleteLink(index), None, what)?;
        let mut st = self.st();
        let before = st.links.len();
        st.links.retain(|_, i| *i != index);
        if st.links.len() == before {
            return Err(kernel(what, ENODEV));
        }
        st.addrs.retain(|m| m.header.index != index);
        Ok(())
    }

    async fn addresses(
        &self,
        what: &str,
        family: IpFamily,
    ) -> Result<Vec<AddressMessage>, NlError> {
        self.call(Call::Addresses(family), None, what)?;
        // As the kernel: the dump is of the family asked for. (The proxy filters anyway;
        // a test lists the other family too to check that.)
        Ok(self.st().addrs.clone())
    }

    async fn add_address(&self, what: &str, msg: AddressMessage) -> Result<(), NlError> {
        self.call(
            Call::AddAddress(msg.clone()),
            Some(Request::AddAddress),
            what,
        )?;
        let mut st = self.st();
        if st.addrs.contains(&msg) {
            return Err(kernel(what, EEXIST));
        }
        st.addrs.push(msg);
        Ok(())
    }

    async fn delete_address(&self, what: &str, msg: AddressMessage) -> Result<(), NlError> {
        self.call(
            Call::DeleteAddress(msg.clone()),
            Some(Request::DeleteAddress),
            what,
        )?;
        let mut st = self.st();
        let before = st.addrs.len();
        st.addrs.retain(|m| *m != msg);
        if st.addrs.len() == before {
            return Err(kernel(what, EADDRNOTAVAIL));
        }
        Ok(())
    }
}
