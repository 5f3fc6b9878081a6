//! What the fake runtime records of streaming calls, and the check it asks before a
//! resource update.

use super::*;
use std::sync::Arc;

/// One Exec, Attach or PortForward the fake answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamRequest {
    Exec {
        id: String,
        cmd: Vec<String>,
        flags: StreamFlags,
    },
    Attach {
        id: String,
        flags: StreamFlags,
    },
    PortForward {
        sandbox_id: String,
        ports: Vec<i32>,
    },
}

/// A check of an UpdateContainerResources (container ID, resources): an error refuses the
/// update with that message.
#[derive(Clone)]
pub struct UpdateCheck(pub Arc<CheckFn>);

/// The check's function: container ID and resources → refused with a message, or not.
pub type CheckFn = dyn Fn(&str, &LinuxResources) -> std::result::Result<(), String> + Send + Sync;

impl std::fmt::Debug for UpdateCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UpdateCheck")
    }
}
