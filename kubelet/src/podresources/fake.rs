//! A fixed set of active pods for tests.

use super::ActivePods;
use k8s_openapi::api::core::v1::Pod;
use std::sync::Mutex;

/// Active pods that tests set.
#[derive(Default)]
pub struct FakePods(pub Mutex<Vec<Pod>>);

impl FakePods {
    pub fn new(pods: Vec<Pod>) -> Self {
        Self(Mutex::new(pods))
    }
}

#[async_trait::async_trait]
impl ActivePods for FakePods {
    async fn active_pods(&self) -> Vec<Pod> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
