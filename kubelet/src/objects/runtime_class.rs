//! RuntimeClasses (`node.k8s.io/v1`): an informer of their handlers and the lookup the
//! sandbox uses (upstream's `pkg/kubelet/runtimeclass`): a pod's `runtimeClassName` becomes
//! the CRI `runtime_handler` of RunPodSandbox; an unknown class fails the sandbox.

use k8s_openapi::api::node::v1::RuntimeClass;

use super::informer::Store;

/// Every RuntimeClass's handler, by name.
pub type RuntimeClassStore = Store<String>;

/// Reduces a RuntimeClass to its handler, for [`super::informer::run`].
pub fn handler_of(rc: &RuntimeClass) -> String {
    rc.handler.clone()
}

/// Why a pod's RuntimeClass gives no handler.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum RuntimeClassError {
    /// The apiserver's NotFound wording, which upstream passes on.
    #[error("runtimeclass.node.k8s.io \"{0}\" not found")]
    NotFound(String),
    #[error("failed to lookup RuntimeClass {0}: the RuntimeClass cache has not synced yet")]
    NotSynced(String),
    #[error(
        "runtimeClassName {0:?} cannot be resolved: the kubelet has no apiserver connection (standalone mode)"
    )]
    Standalone(String),
}

/// Upstream's LookupRuntimeHandler: no class (or `""`) is the runtime's default handler
/// (`""`); otherwise the class's handler. `store` is None without an apiserver.
pub fn lookup_handler(
    store: Option<&RuntimeClassStore>,
    class: Option<&str>,
) -> Result<String, RuntimeClassError> {
    let Some(name) = class.filter(|n| !n.is_empty()) else {
        return Ok(String::new());
    };
    let Some(store) = store else {
        return Err(RuntimeClassError::Standalone(name.into()));
    };
    match store.get(name) {
        Some(h) => Ok(h),
        None if !store.has_synced() => Err(RuntimeClassError::NotSynced(name.into())),
        None => Err(RuntimeClassError::NotFound(name.into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn resolves_handlers_as_upstream() {
        let store = RuntimeClassStore::default();
        assert_eq!(lookup_handler(Some(&store), None), Ok(String::new()));
        assert_eq!(lookup_handler(None, Some("")), Ok(String::new()));
        assert_eq!(
            lookup_handler(Some(&store), Some("gvisor")),
            Err(RuntimeClassError::NotSynced("gvisor".into()))
        );
        store.replace(HashMap::from([("gvisor".to_string(), "runsc".to_string())]));
        assert_eq!(
            lookup_handler(Some(&store), Some("gvisor")),
            Ok("runsc".into())
        );
        let missing = lookup_handler(Some(&store), Some("kata")).unwrap_err();
        assert_eq!(
            missing.to_string(),
            "runtimeclass.node.k8s.io \"kata\" not found"
        );
        let standalone = lookup_handler(None, Some("gvisor")).unwrap_err();
        assert!(
            standalone.to_string().contains("standalone"),
            "{standalone}"
        );
        store.delete("gvisor");
        assert!(matches!(
            lookup_handler(Some(&store), Some("gvisor")),
            Err(RuntimeClassError::NotFound(_))
        ));
    }
}
