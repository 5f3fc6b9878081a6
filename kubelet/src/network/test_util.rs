//! Fakes of the network controller's kernel edges: [`FakeRoutes`] keeps a route table and
//! records every call; [`FakeMasquerade`] records what it was asked to apply.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Mutex;

use cni::ip::IpNet;

use super::NetworkError;
use super::masquerade::Masquerade;
use super::routes::{Route, Routes};

/// One call the fake saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteCall {
    List,
    Replace(Route),
    Delete(Route),
}

/// A kernel route table of our routes, with the calls made and injectable failures.
#[derive(Debug, Default)]
pub struct FakeRoutes {
    pub table: Mutex<BTreeMap<IpNet, IpAddr>>,
    pub calls: Mutex<Vec<RouteCall>>,
    /// Destinations whose replace fails (as an unreachable gateway would).
    pub fail: Mutex<Vec<IpNet>>,
}

impl FakeRoutes {
    pub fn routes(&self) -> BTreeMap<IpNet, IpAddr> {
        self.table.lock().unwrap().clone()
    }

    /// The calls since the last `take_calls`.
    pub fn take_calls(&self) -> Vec<RouteCall> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }
}

#[async_trait::async_trait]
impl Routes for FakeRoutes {
    async fn list(&self) -> Result<Vec<Route>, NetworkError> {
        self.calls.lock().unwrap().push(RouteCall::List);
        Ok(self
            .table
            .lock()
            .unwrap()
            .iter()
            .map(|(dst, via)| Route {
                dst: *dst,
                via: *via,
            })
            .collect())
    }

    async fn replace(&self, route: Route) -> Result<(), NetworkError> {
        self.calls.lock().unwrap().push(RouteCall::Replace(route));
        if self.fail.lock().unwrap().contains(&route.dst) {
            return Err(NetworkError::Netlink(format!(
                "route {}: network is unreachable",
                route.dst
            )));
        }
        self.table.lock().unwrap().insert(route.dst, route.via);
        Ok(())
    }

    async fn delete(&self, route: Route) -> Result<(), NetworkError> {
        self.calls.lock().unwrap().push(RouteCall::Delete(route));
        self.table.lock().unwrap().remove(&route.dst);
        Ok(())
    }
}

/// Records each `apply`.
#[derive(Debug, Default)]
pub struct FakeMasquerade {
    pub applied: Mutex<Vec<Vec<IpNet>>>,
}

#[async_trait::async_trait]
impl Masquerade for FakeMasquerade {
    async fn apply(&self, cluster_cidrs: &[IpNet]) -> Result<(), NetworkError> {
        self.applied.lock().unwrap().push(cluster_cidrs.to_vec());
        Ok(())
    }
}
