//! The runtime handlers' features the fake's Status reports.

use super::*;

impl FakeRuntime {
    /// Status reports these features for `handler`.
    pub fn set_handler_features(&self, handler: &str, f: HandlerFeatures) {
        let mut s = self.state.lock().unwrap();
        s.handler_features.insert(handler.into(), f);
    }

    /// What Status reports for `handler` (none: the handler has no features).
    pub(super) fn features_of(&self, handler: &str) -> Result<HandlerFeatures> {
        let s = self.enter("Status")?;
        Ok(s.handler_features.get(handler).copied().unwrap_or_default())
    }
}
