//! A recording [`PluginHandler`] for tests.

use std::sync::Mutex;

use super::{PluginError, PluginHandler};

/// The refusal a [`FakeHandler`] was told to give.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// Records every call; refuses validation or registration when told to.
#[derive(Debug, Default)]
pub struct FakeHandler {
    pub calls: Mutex<Vec<String>>,
    pub refuse_validate: Mutex<Option<String>>,
    pub refuse_register: Mutex<Option<String>>,
}

impl FakeHandler {
    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

#[async_trait::async_trait]
impl PluginHandler for FakeHandler {
    async fn validate(
        &self,
        name: &str,
        endpoint: &str,
        versions: &[String],
    ) -> Result<(), PluginError> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("validate {name} {endpoint} {}", versions.join(",")));
        match self.refuse_validate.lock().unwrap().clone() {
            Some(e) => Err(PluginError::new(Refused(e))),
            None => Ok(()),
        }
    }
    async fn register(
        &self,
        name: &str,
        endpoint: &str,
        _versions: &[String],
    ) -> Result<(), PluginError> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("register {name} {endpoint}"));
        match self.refuse_register.lock().unwrap().clone() {
            Some(e) => Err(PluginError::new(Refused(e))),
            None => Ok(()),
        }
    }
    async fn deregister(&self, name: &str) {
        self.calls
            .lock()
            .unwrap()
            .push(format!("deregister {name}"));
    }
}
