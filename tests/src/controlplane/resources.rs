//! The resources the test control plane serves.

/// One served resource (group/version/plural) with the behaviours that vary by type.
#[derive(Debug)]
pub struct ResourceDef {
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    /// Serves `/status` (PUT/PATCH touch only `.status`).
    pub status: bool,
    /// Serves `/approval` (CSRs).
    pub approval: bool,
    /// PUT on a missing object creates it (upstream `AllowCreateOnUpdate`).
    pub create_on_update: bool,
    /// Field selector labels beyond `metadata.name` / `metadata.namespace`.
    pub fields: &'static [&'static str],
    pub short: &'static [&'static str],
}

impl ResourceDef {
    /// `pods`, `leases.coordination.k8s.io`: how upstream names a resource in messages.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// `v1`, `coordination.k8s.io/v1`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Collection path without namespace, e.g. `/api/v1/pods`.
    pub fn base_path(&self) -> String {
        if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        }
    }

    /// The URL of one object or collection.
    pub fn path(&self, namespace: Option<&str>, name: Option<&str>) -> String {
        let mut p = self.base_path();
        if let (true, Some(ns)) = (self.namespaced, namespace) {
            p.push_str(&format!("/namespaces/{ns}"));
        }
        p.push('/');
        p.push_str(self.plural);
        if let Some(n) = name {
            p.push('/');
            p.push_str(n);
        }
        p
    }

    /// Supported field selector labels.
    pub fn supports_field(&self, field: &str) -> bool {
        field == "metadata.name"
            || (self.namespaced && field == "metadata.namespace")
            || self.fields.contains(&field)
    }
}

const POD_FIELDS: &[&str] = &[
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
];
const EVENT_FIELDS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];
const EVENTS_V1_FIELDS: &[&str] = &[
    "regarding.kind",
    "regarding.namespace",
    "regarding.name",
    "regarding.uid",
    "regarding.apiVersion",
    "regarding.resourceVersion",
    "regarding.fieldPath",
    "reason",
    "reportingController",
    "type",
];

const fn def(
    group: &'static str,
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
) -> ResourceDef {
    ResourceDef {
        group,
        version: "v1",
        plural,
        singular,
        kind,
        namespaced,
        status: false,
        approval: false,
        create_on_update: false,
        fields: &[],
        short: &[],
    }
}

/// Every served resource.
pub static RESOURCES: &[ResourceDef] = &[
    ResourceDef {
        status: true,
        fields: POD_FIELDS,
        short: &["po"],
        ..def("", "pods", "pod", "Pod", true)
    },
    ResourceDef {
        status: true,
        fields: &["spec.unschedulable"],
        short: &["no"],
        ..def("", "nodes", "node", "Node", false)
    },
    ResourceDef {
        create_on_update: true,
        fields: EVENT_FIELDS,
        short: &["ev"],
        ..def("", "events", "event", "Event", true)
    },
    ResourceDef {
        short: &["cm"],
        ..def("", "configmaps", "configmap", "ConfigMap", true)
    },
    ResourceDef {
        fields: &["type"],
        ..def("", "secrets", "secret", "Secret", true)
    },
    ResourceDef {
        status: true,
        short: &["svc"],
        ..def("", "services", "service", "Service", true)
    },
    ResourceDef {
        short: &["ep"],
        ..def("", "endpoints", "endpoints", "Endpoints", true)
    },
    ResourceDef {
        short: &["sa"],
        ..def(
            "",
            "serviceaccounts",
            "serviceaccount",
            "ServiceAccount",
            true,
        )
    },
    ResourceDef {
        status: true,
        fields: &["status.phase"],
        short: &["ns"],
        ..def("", "namespaces", "namespace", "Namespace", false)
    },
    ResourceDef {
        create_on_update: true,
        ..def("coordination.k8s.io", "leases", "lease", "Lease", true)
    },
    ResourceDef {
        status: true,
        approval: true,
        fields: &["spec.signerName"],
        short: &["csr"],
        ..def(
            "certificates.k8s.io",
            "certificatesigningrequests",
            "certificatesigningrequest",
            "CertificateSigningRequest",
            false,
        )
    },
    ResourceDef {
        fields: &["addressType"],
        ..def(
            "discovery.k8s.io",
            "endpointslices",
            "endpointslice",
            "EndpointSlice",
            true,
        )
    },
    ResourceDef {
        short: &[],
        ..def(
            "node.k8s.io",
            "runtimeclasses",
            "runtimeclass",
            "RuntimeClass",
            false,
        )
    },
    ResourceDef {
        status: true,
        short: &["pv"],
        ..def(
            "",
            "persistentvolumes",
            "persistentvolume",
            "PersistentVolume",
            false,
        )
    },
    ResourceDef {
        status: true,
        short: &["pvc"],
        ..def(
            "",
            "persistentvolumeclaims",
            "persistentvolumeclaim",
            "PersistentVolumeClaim",
            true,
        )
    },
    ResourceDef {
        ..def("storage.k8s.io", "csinodes", "csinode", "CSINode", false)
    },
    ResourceDef {
        ..def(
            "storage.k8s.io",
            "csidrivers",
            "csidriver",
            "CSIDriver",
            false,
        )
    },
    ResourceDef {
        status: true,
        ..def(
            "storage.k8s.io",
            "volumeattachments",
            "volumeattachment",
            "VolumeAttachment",
            false,
        )
    },
    ResourceDef {
        short: &["sc"],
        ..def(
            "storage.k8s.io",
            "storageclasses",
            "storageclass",
            "StorageClass",
            false,
        )
    },
    ResourceDef {
        status: true,
        ..def(
            "resource.k8s.io",
            "resourceclaims",
            "resourceclaim",
            "ResourceClaim",
            true,
        )
    },
    // Published by DRA drivers, wiped by the kubelet (`spec.nodeName`, `spec.driver`: the
    // field selectors upstream's strategy offers).
    ResourceDef {
        fields: &["spec.nodeName", "spec.driver"],
        ..def(
            "resource.k8s.io",
            "resourceslices",
            "resourceslice",
            "ResourceSlice",
            false,
        )
    },
    ResourceDef {
        create_on_update: true,
        fields: EVENTS_V1_FIELDS,
        short: &["ev"],
        ..def("events.k8s.io", "events", "event", "Event", true)
    },
];

/// Look a resource up by API group and plural.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static ResourceDef> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// Look a resource up by `plural` (core) or `plural.group`, e.g. `leases.coordination.k8s.io`.
pub fn by_name(name: &str) -> Option<&'static ResourceDef> {
    RESOURCES.iter().find(|r| r.qualified() == name)
}

/// The distinct API groups (other than core) in serving order.
pub fn groups() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for r in RESOURCES {
        if !r.group.is_empty() && !out.contains(&r.group) {
            out.push(r.group);
        }
    }
    out
}
