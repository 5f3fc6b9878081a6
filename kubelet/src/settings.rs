//! The kubelet's registry of every flag and KubeletConfiguration field it accepts, with what
//! each does here (see [`proxy::settings`] for the rule and the shared machinery), and the
//! start-time host checks upstream makes for some of them (`protectKernelDefaults`,
//! `failSwapOn`).
//!
//! `docs/settings.md` is generated from these registries and kube-proxy's; the `settings_doc`
//! test fails when it is stale (`UPDATE_SETTINGS_DOC=1 cargo test -p kubelet settings_doc`
//! rewrites it).

use Status::*;
pub use proxy::settings::{Findings, Setting, Status};

const fn s(
    name: &'static str,
    status: Status,
    ok: &'static [&'static str],
    note: &'static str,
) -> Setting {
    Setting {
        name,
        status,
        ok,
        note,
    }
}

const NO_GC: &str = "there is no image garbage collection.";
const NO_EVICTION: &str = "there is no eviction manager.";
const NO_ALLOCATABLE: &str = "node allocatable is not computed or enforced.";
const NO_LOG_ROTATION: &str = "container logs are not rotated.";
const NO_CM: &str = "there is no CPU/memory/topology manager.";

/// The kubelet's flags.
pub const FLAGS: &[Setting] = &[
    s("--version", Implemented, &[], "Prints the version."),
    s("--config", Implemented, &[], "KubeletConfiguration file."),
    s(
        "--kubeconfig",
        Implemented,
        &[],
        "Apiserver credentials; absent means standalone mode.",
    ),
    s(
        "--bootstrap-kubeconfig",
        Implemented,
        &[],
        "TLS bootstrap credentials.",
    ),
    s("--cert-dir", Implemented, &[], "Certificate directory."),
    s("--root-dir", Implemented, &[], "State directory."),
    s(
        "--container-runtime-endpoint",
        Implemented,
        &[],
        "CRI endpoint.",
    ),
    s(
        "--image-service-endpoint",
        Implemented,
        &[],
        "CRI image endpoint.",
    ),
    s("--node-ip", Implemented, &[], "Node addresses."),
    s("--hostname-override", Implemented, &[], "Node name."),
    s(
        "--register-with-taints",
        Implemented,
        &[],
        "Taints at registration.",
    ),
    s("--node-labels", Implemented, &[], "Labels at registration."),
    s(
        "--pod-infra-container-image",
        Implemented,
        &[],
        "As upstream, the runtime's sandbox image wins; upstream's only other effect (exempting it from image GC) holds trivially: images are never collected.",
    ),
    s(
        "--pod-manifest-path",
        Implemented,
        &[],
        "Static pod directory.",
    ),
    s(
        "--proxy-config",
        Implemented,
        &[],
        "Not upstream: hosts the kube-proxy role in-process.",
    ),
    s("--v", Implemented, &[], "Log verbosity."),
    s(
        "--vmodule",
        NotImplemented,
        &[],
        "per-file verbosity is not supported; use RUST_LOG.",
    ),
    s(
        "--logging-format",
        NotImplemented,
        &["text"],
        "logs are always text.",
    ),
    s(
        "--fail-swap-on",
        Implemented,
        &[],
        "Start fails when swap is on, as upstream.",
    ),
    s("--cgroup-driver", Implemented, &[], "cgroupfs or systemd."),
    s("--cgroup-root", Implemented, &[], "Root cgroup for pods."),
    s(
        "--cgroups-per-qos",
        Implemented,
        &[],
        "QoS cgroup hierarchy.",
    ),
    s("--cluster-dns", Implemented, &[], "Pod DNS servers."),
    s(
        "--cluster-domain",
        Implemented,
        &[],
        "Pod DNS search domain.",
    ),
    s("--resolv-conf", Implemented, &[], "Host resolver file."),
    s("--max-pods", Implemented, &[], "Pod capacity."),
    s("--port", Implemented, &[], "HTTPS API port."),
    s("--address", Implemented, &[], "HTTPS API address."),
    s("--healthz-port", Implemented, &[], "Healthz port."),
    s(
        "--healthz-bind-address",
        Implemented,
        &[],
        "Healthz address.",
    ),
    s(
        "--read-only-port",
        Refused,
        &["0"],
        "the unauthenticated read-only port is not served. (Upstream serves 10255 when neither this flag nor --config is given; this agent never does.)",
    ),
    s("--tls-cert-file", Implemented, &[], "Serving certificate."),
    s("--tls-private-key-file", Implemented, &[], "Serving key."),
    s(
        "--runtime-request-timeout",
        Implemented,
        &[],
        "CRI call timeout.",
    ),
    s(
        "--node-status-update-frequency",
        Implemented,
        &[],
        "Node status period.",
    ),
    s(
        "--file-check-frequency",
        Implemented,
        &[],
        "Static pod re-read period.",
    ),
    s("--sync-frequency", Implemented, &[], "Pod resync period."),
    s("--register-node", Implemented, &[], "Registers the Node."),
    s(
        "--rotate-certificates",
        Implemented,
        &[],
        "Client certificate rotation.",
    ),
    s(
        "--serialize-image-pulls",
        NotImplemented,
        &["true"],
        "image pulls are always serialized.",
    ),
    s(
        "--anonymous-auth",
        Implemented,
        &[],
        "Anonymous requests to :10250 (authenticated requests are not yet possible: see authentication).",
    ),
    s(
        "--authentication-token-webhook",
        Implemented,
        &[],
        "TokenReview is not implemented yet: fail-closed (401 unless anonymous is enabled); standalone it refuses to start, as upstream.",
    ),
    s(
        "--authorization-mode",
        Implemented,
        &[],
        "AlwaysAllow, or Webhook: SubjectAccessReview is not implemented yet, so every request gets 403 (fail-closed); standalone Webhook refuses to start, as upstream.",
    ),
    s(
        "--client-ca-file",
        NotImplemented,
        &[],
        "client certificates are not verified yet: no request authenticates by certificate (fail-closed: 401 when anonymous is disabled).",
    ),
    s(
        "--provider-id",
        NotImplemented,
        &[],
        "the Node's spec.providerID is not set.",
    ),
    s(
        "--cloud-provider",
        NotImplemented,
        &[],
        "external cloud provider integration (the uninitialized taint) is not done.",
    ),
    s(
        "--pod-cidr",
        NotImplemented,
        &[],
        "the pod CIDR comes from the CNI configuration.",
    ),
    s("--kube-api-qps", Implemented, &[], "Client rate limit."),
    s("--kube-api-burst", Implemented, &[], "Client burst."),
    s(
        "--feature-gates",
        NotImplemented,
        &[],
        "feature gates are not read.",
    ),
    s("--eviction-hard", NotImplemented, &[], NO_EVICTION),
    s("--kube-reserved", NotImplemented, &[], NO_ALLOCATABLE),
    s("--system-reserved", NotImplemented, &[], NO_ALLOCATABLE),
    s(
        "--runtime-cgroups",
        NotImplemented,
        &[],
        "the runtime is not moved into a cgroup.",
    ),
    s(
        "--kubelet-cgroups",
        NotImplemented,
        &[],
        "the kubelet is not moved into a cgroup.",
    ),
    s(
        "--enforce-node-allocatable",
        NotImplemented,
        &["pods"],
        NO_ALLOCATABLE,
    ),
    s(
        "--volume-plugin-dir",
        NotImplemented,
        &["/usr/libexec/kubernetes/kubelet-plugins/volume/exec/"],
        "FlexVolume plugins are not supported.",
    ),
    s("--image-gc-high-threshold", NotImplemented, &["85"], NO_GC),
    s("--image-gc-low-threshold", NotImplemented, &["80"], NO_GC),
    s(
        "--image-credential-provider-config",
        NotImplemented,
        &[],
        "credential provider plugins are not run.",
    ),
    s(
        "--image-credential-provider-bin-dir",
        NotImplemented,
        &[],
        "credential provider plugins are not run.",
    ),
    s(
        "--container-log-max-size",
        NotImplemented,
        &["10Mi"],
        NO_LOG_ROTATION,
    ),
    s(
        "--container-log-max-files",
        NotImplemented,
        &["5"],
        NO_LOG_ROTATION,
    ),
    s(
        "--tls-cipher-suites",
        Implemented,
        &[],
        "Go names mapped to rustls suites; names rustls does not provide are refused.",
    ),
    s(
        "--tls-min-version",
        Implemented,
        &[],
        "VersionTLS12 or VersionTLS13; VersionTLS10/11 are refused (rustls serves only TLS 1.2 and 1.3).",
    ),
    s(
        "--hairpin-mode",
        NotImplemented,
        &["promiscuous-bridge"],
        "hairpin is left to the CNI plugin.",
    ),
    s(
        "--node-status-max-images",
        NotImplemented,
        &["50"],
        "the Node's status lists no images.",
    ),
    s(
        "--max-open-files",
        NotImplemented,
        &["1000000"],
        "the process's file limit is not changed.",
    ),
    s(
        "--streaming-connection-idle-timeout",
        NotImplemented,
        &["4h"],
        "exec/attach/port-forward streaming is not served.",
    ),
    s("--lock-file", NotImplemented, &[], "no lock file is taken."),
    s(
        "--exit-on-lock-contention",
        NotImplemented,
        &["false"],
        "no lock file is taken.",
    ),
    s(
        "--protect-kernel-defaults",
        Implemented,
        &[],
        "Start fails when the kernel tunables differ from upstream's expected values (checked, never written; without it upstream writes them, this agent does not).",
    ),
    s(
        "--seccomp-default",
        Refused,
        &["false"],
        "RuntimeDefault is not applied to containers without a seccomp profile.",
    ),
    s(
        "--local-storage-capacity-isolation",
        NotImplemented,
        &["true"],
        "ephemeral storage is not measured or limited.",
    ),
    s(
        "--log-flush-frequency",
        NotImplemented,
        &["5s"],
        "logs are written unbuffered.",
    ),
];

/// KubeletConfiguration (kubelet.config.k8s.io/v1beta1) fields; nested ones as `outer.inner`.
pub const FIELDS: &[Setting] = &[
    s(
        "apiVersion",
        Implemented,
        &[],
        "kubelet.config.k8s.io/v1beta1.",
    ),
    s("kind", Implemented, &[], "KubeletConfiguration."),
    s(
        "enableServer",
        Implemented,
        &[],
        "false: the :10250 server is not started.",
    ),
    s("staticPodPath", Implemented, &[], "Static pod directory."),
    s("podLogsDir", Implemented, &[], "Container log directory."),
    s("syncFrequency", Implemented, &[], "Pod resync period."),
    s(
        "fileCheckFrequency",
        Implemented,
        &[],
        "Static pod re-read period.",
    ),
    s(
        "httpCheckFrequency",
        NotImplemented,
        &["20s", "0s"],
        "static pods from a URL are not supported.",
    ),
    s(
        "staticPodURL",
        NotImplemented,
        &[],
        "static pods from a URL are not supported.",
    ),
    s(
        "staticPodURLHeader",
        NotImplemented,
        &[],
        "static pods from a URL are not supported.",
    ),
    s("address", Implemented, &[], "HTTPS API address."),
    s("port", Implemented, &[], "HTTPS API port."),
    s(
        "readOnlyPort",
        Refused,
        &["0"],
        "the unauthenticated read-only port is not served.",
    ),
    s("tlsCertFile", Implemented, &[], "Serving certificate."),
    s("tlsPrivateKeyFile", Implemented, &[], "Serving key."),
    s(
        "tlsCipherSuites",
        Implemented,
        &[],
        "Go names mapped to rustls suites; names rustls does not provide are refused.",
    ),
    s(
        "tlsMinVersion",
        Implemented,
        &[],
        "VersionTLS12 or VersionTLS13; VersionTLS10/11 are refused (rustls serves only TLS 1.2 and 1.3).",
    ),
    s(
        "rotateCertificates",
        Implemented,
        &[],
        "Client certificate rotation.",
    ),
    s(
        "serverTLSBootstrap",
        Refused,
        &["false"],
        "the serving certificate is not requested from the apiserver (it is self-signed or tlsCertFile).",
    ),
    s(
        "authentication.x509.clientCAFile",
        NotImplemented,
        &[],
        "client certificates are not verified yet: no request authenticates by certificate (fail-closed: 401 when anonymous is disabled).",
    ),
    s(
        "authentication.webhook.enabled",
        Implemented,
        &[],
        "TokenReview is not implemented yet: fail-closed (401 unless anonymous is enabled); standalone it refuses to start, as upstream.",
    ),
    s(
        "authentication.webhook.cacheTTL",
        NotImplemented,
        &["2m", "0s"],
        "TokenReview is not implemented yet.",
    ),
    s(
        "authentication.anonymous.enabled",
        Implemented,
        &[],
        "Anonymous requests to :10250.",
    ),
    s(
        "authorization.mode",
        Implemented,
        &[],
        "AlwaysAllow, or Webhook: SubjectAccessReview is not implemented yet, so every request gets 403 (fail-closed); standalone Webhook refuses to start, as upstream.",
    ),
    s(
        "authorization.webhook.cacheAuthorizedTTL",
        NotImplemented,
        &["5m", "0s"],
        "SubjectAccessReview is not implemented yet.",
    ),
    s(
        "authorization.webhook.cacheUnauthorizedTTL",
        NotImplemented,
        &["30s", "0s"],
        "SubjectAccessReview is not implemented yet.",
    ),
    s(
        "registryPullQPS",
        NotImplemented,
        &["5"],
        "image pulls are not rate limited.",
    ),
    s(
        "registryBurst",
        NotImplemented,
        &["10"],
        "image pulls are not rate limited.",
    ),
    s(
        "imagePullCredentialsVerificationPolicy",
        Refused,
        &["NeverVerifyPreloadedImages", "NeverVerify"],
        "pods are not checked for credentials to images already on the node.",
    ),
    s(
        "preloadedImagesVerificationAllowlist",
        NotImplemented,
        &[],
        "pods are not checked for credentials to images already on the node.",
    ),
    s(
        "eventRecordQPS",
        NotImplemented,
        &["50"],
        "events are not rate limited.",
    ),
    s(
        "eventBurst",
        NotImplemented,
        &["100"],
        "events are not rate limited.",
    ),
    s(
        "enableDebuggingHandlers",
        Implemented,
        &[],
        "The debugging handlers (exec, attach, logs, run) are not served at all, so false holds.",
    ),
    s(
        "enableContentionProfiling",
        NotImplemented,
        &["false"],
        "no profiling handlers are served.",
    ),
    s("healthzPort", Implemented, &[], "Healthz port."),
    s("healthzBindAddress", Implemented, &[], "Healthz address."),
    s(
        "oomScoreAdj",
        NotImplemented,
        &["-999"],
        "the process's OOM score is not changed.",
    ),
    s("clusterDomain", Implemented, &[], "Pod DNS search domain."),
    s("clusterDNS", Implemented, &[], "Pod DNS servers."),
    s(
        "streamingConnectionIdleTimeout",
        NotImplemented,
        &["4h", "0s"],
        "exec/attach/port-forward streaming is not served.",
    ),
    s(
        "nodeStatusUpdateFrequency",
        Implemented,
        &[],
        "Node status period.",
    ),
    s(
        "nodeStatusReportFrequency",
        Implemented,
        &[],
        "Node status report period.",
    ),
    s(
        "nodeLeaseDurationSeconds",
        Implemented,
        &[],
        "Lease duration.",
    ),
    s("imageMinimumGCAge", NotImplemented, &["2m", "0s"], NO_GC),
    s("imageMaximumGCAge", NotImplemented, &["0s"], NO_GC),
    s(
        "imageGCHighThresholdPercent",
        NotImplemented,
        &["85"],
        NO_GC,
    ),
    s("imageGCLowThresholdPercent", NotImplemented, &["80"], NO_GC),
    s(
        "volumeStatsAggPeriod",
        NotImplemented,
        &["1m", "0s"],
        "volume usage is not measured.",
    ),
    s(
        "kubeletCgroups",
        NotImplemented,
        &[],
        "the kubelet is not moved into a cgroup.",
    ),
    s(
        "systemCgroups",
        NotImplemented,
        &[],
        "system processes are not moved into a cgroup.",
    ),
    s("cgroupRoot", Implemented, &[], "Root cgroup for pods."),
    s("cgroupsPerQOS", Implemented, &[], "QoS cgroup hierarchy."),
    s("cgroupDriver", Implemented, &[], "cgroupfs or systemd."),
    s("cpuManagerPolicy", NotImplemented, &["none"], NO_CM),
    s("cpuManagerPolicyOptions", NotImplemented, &[], NO_CM),
    s(
        "cpuManagerReconcilePeriod",
        NotImplemented,
        &["10s", "0s"],
        NO_CM,
    ),
    s(
        "singleProcessOOMKill",
        NotImplemented,
        &["false"],
        "the cgroup's memory.oom.group is left as the runtime sets it.",
    ),
    s("memoryManagerPolicy", NotImplemented, &["None"], NO_CM),
    s("topologyManagerPolicy", NotImplemented, &["none"], NO_CM),
    s(
        "topologyManagerScope",
        NotImplemented,
        &["container"],
        NO_CM,
    ),
    s("topologyManagerPolicyOptions", NotImplemented, &[], NO_CM),
    s("qosReserved", NotImplemented, &[], NO_CM),
    s(
        "runtimeRequestTimeout",
        Implemented,
        &[],
        "CRI call timeout.",
    ),
    s(
        "hairpinMode",
        NotImplemented,
        &["promiscuous-bridge"],
        "hairpin is left to the CNI plugin.",
    ),
    s("maxPods", Implemented, &[], "Pod capacity."),
    s(
        "podCIDR",
        NotImplemented,
        &[],
        "the pod CIDR comes from the CNI configuration.",
    ),
    s(
        "podPidsLimit",
        NotImplemented,
        &["-1", "0"],
        "pod cgroups get no pids limit.",
    ),
    s("resolvConf", Implemented, &[], "Host resolver file."),
    s(
        "runOnce",
        NotImplemented,
        &["false"],
        "the agent always runs continuously.",
    ),
    s(
        "cpuCFSQuota",
        NotImplemented,
        &["true"],
        "CPU limits are always enforced with CFS quota.",
    ),
    s(
        "cpuCFSQuotaPeriod",
        NotImplemented,
        &["100ms", "0s"],
        "the CFS period is always 100ms.",
    ),
    s(
        "nodeStatusMaxImages",
        NotImplemented,
        &["50"],
        "the Node's status lists no images.",
    ),
    s(
        "maxOpenFiles",
        NotImplemented,
        &["1000000"],
        "the process's file limit is not changed.",
    ),
    s(
        "contentType",
        NotImplemented,
        &["application/vnd.kubernetes.protobuf"],
        "the client always speaks JSON.",
    ),
    s("kubeAPIQPS", Implemented, &[], "Client rate limit."),
    s("kubeAPIBurst", Implemented, &[], "Client burst."),
    s(
        "serializeImagePulls",
        NotImplemented,
        &["true"],
        "image pulls are always serialized.",
    ),
    s(
        "maxParallelImagePulls",
        NotImplemented,
        &["1"],
        "image pulls are always serialized.",
    ),
    s("evictionHard", NotImplemented, &[], NO_EVICTION),
    s("evictionSoft", NotImplemented, &[], NO_EVICTION),
    s("evictionSoftGracePeriod", NotImplemented, &[], NO_EVICTION),
    s(
        "evictionPressureTransitionPeriod",
        NotImplemented,
        &["5m", "0s"],
        NO_EVICTION,
    ),
    s(
        "evictionMaxPodGracePeriod",
        NotImplemented,
        &["0"],
        NO_EVICTION,
    ),
    s("evictionMinimumReclaim", NotImplemented, &[], NO_EVICTION),
    s(
        "mergeDefaultEvictionSettings",
        NotImplemented,
        &["false"],
        NO_EVICTION,
    ),
    s(
        "podsPerCore",
        NotImplemented,
        &["0"],
        "pod capacity is maxPods only.",
    ),
    s(
        "enableControllerAttachDetach",
        NotImplemented,
        &["true"],
        "attachable volumes are not supported.",
    ),
    s(
        "protectKernelDefaults",
        Implemented,
        &[],
        "Start fails when the kernel tunables differ from upstream's expected values (checked, never written; without it upstream writes them, this agent does not).",
    ),
    s(
        "makeIPTablesUtilChains",
        Implemented,
        &[],
        "Deprecated; no effect upstream either.",
    ),
    s(
        "iptablesMasqueradeBit",
        Implemented,
        &[],
        "Deprecated; no effect upstream either.",
    ),
    s(
        "iptablesDropBit",
        Implemented,
        &[],
        "Deprecated; no effect upstream either.",
    ),
    s(
        "featureGates",
        NotImplemented,
        &[],
        "feature gates are not read.",
    ),
    s(
        "failSwapOn",
        Implemented,
        &[],
        "Start fails when swap is on, as upstream.",
    ),
    s(
        "memorySwap.swapBehavior",
        NotImplemented,
        &["NoSwap"],
        "containers get no swap settings.",
    ),
    s(
        "containerLogMaxSize",
        NotImplemented,
        &["10Mi"],
        NO_LOG_ROTATION,
    ),
    s(
        "containerLogMaxFiles",
        NotImplemented,
        &["5"],
        NO_LOG_ROTATION,
    ),
    s(
        "containerLogMaxWorkers",
        NotImplemented,
        &["1"],
        NO_LOG_ROTATION,
    ),
    s(
        "containerLogMonitorInterval",
        NotImplemented,
        &["10s", "0s"],
        NO_LOG_ROTATION,
    ),
    s(
        "configMapAndSecretChangeDetectionStrategy",
        NotImplemented,
        &["Watch"],
        "ConfigMap/Secret volumes are not supported.",
    ),
    s("systemReserved", NotImplemented, &[], NO_ALLOCATABLE),
    s("kubeReserved", NotImplemented, &[], NO_ALLOCATABLE),
    s("reservedSystemCPUs", NotImplemented, &[], NO_ALLOCATABLE),
    s(
        "showHiddenMetricsForVersion",
        NotImplemented,
        &[],
        "hidden metrics are not served.",
    ),
    s("systemReservedCgroup", NotImplemented, &[], NO_ALLOCATABLE),
    s("kubeReservedCgroup", NotImplemented, &[], NO_ALLOCATABLE),
    s(
        "enforceNodeAllocatable",
        NotImplemented,
        &["[pods]"],
        NO_ALLOCATABLE,
    ),
    s(
        "allowedUnsafeSysctls",
        NotImplemented,
        &[],
        "pod sysctls are not filtered by this list.",
    ),
    s(
        "volumePluginDir",
        NotImplemented,
        &["/usr/libexec/kubernetes/kubelet-plugins/volume/exec/"],
        "FlexVolume plugins are not supported.",
    ),
    s(
        "providerID",
        NotImplemented,
        &[],
        "the Node's spec.providerID is not set.",
    ),
    s(
        "kernelMemcgNotification",
        NotImplemented,
        &["false"],
        NO_EVICTION,
    ),
    s(
        "logging.format",
        NotImplemented,
        &["text"],
        "logs are always text.",
    ),
    s(
        "logging.flushFrequency",
        NotImplemented,
        &["5s", "0"],
        "logs are written unbuffered.",
    ),
    s(
        "logging.verbosity",
        NotImplemented,
        &["0"],
        "verbosity comes from --v (or RUST_LOG) only.",
    ),
    s(
        "logging.vmodule",
        NotImplemented,
        &[],
        "per-file verbosity is not supported; use RUST_LOG.",
    ),
    s(
        "logging.options.json.infoBufferSize",
        NotImplemented,
        &["0"],
        "logs are always text.",
    ),
    s(
        "logging.options.json.splitStream",
        NotImplemented,
        &["false"],
        "logs are always text.",
    ),
    s(
        "logging.options.text.infoBufferSize",
        NotImplemented,
        &["0"],
        "logs are written unbuffered.",
    ),
    s(
        "logging.options.text.splitStream",
        NotImplemented,
        &["false"],
        "all logs go to stderr.",
    ),
    s(
        "enableSystemLogHandler",
        Implemented,
        &[],
        "The /logs handler is not served at all, so false holds.",
    ),
    s(
        "enableSystemLogQuery",
        NotImplemented,
        &["false"],
        "the /logs handler is not served.",
    ),
    s(
        "shutdownGracePeriod",
        NotImplemented,
        &["0s"],
        "there is no graceful node shutdown.",
    ),
    s(
        "shutdownGracePeriodCriticalPods",
        NotImplemented,
        &["0s"],
        "there is no graceful node shutdown.",
    ),
    s(
        "shutdownGracePeriodByPodPriority",
        NotImplemented,
        &[],
        "there is no graceful node shutdown.",
    ),
    s(
        "crashLoopBackOff.maxContainerRestartPeriod",
        NotImplemented,
        &["5m"],
        "the restart back-off is capped at 5m.",
    ),
    s("reservedMemory", NotImplemented, &[], NO_CM),
    s(
        "enableProfilingHandler",
        Implemented,
        &[],
        "No pprof handlers are served at all, so false holds.",
    ),
    s(
        "enableDebugFlagsHandler",
        Implemented,
        &[],
        "No /debug/flags handler is served at all, so false holds.",
    ),
    s(
        "seccompDefault",
        Refused,
        &["false"],
        "RuntimeDefault is not applied to containers without a seccomp profile.",
    ),
    s(
        "memoryThrottlingFactor",
        NotImplemented,
        &["0.9"],
        "memory QoS (memory.high) is not set.",
    ),
    s(
        "registerWithTaints",
        Implemented,
        &[],
        "Taints at registration.",
    ),
    s("registerNode", Implemented, &[], "Registers the Node."),
    s(
        "tracing",
        NotImplemented,
        &[],
        "no OpenTelemetry traces are exported.",
    ),
    s(
        "localStorageCapacityIsolation",
        NotImplemented,
        &["true"],
        "ephemeral storage is not measured or limited.",
    ),
    s(
        "containerRuntimeEndpoint",
        Implemented,
        &[],
        "CRI endpoint.",
    ),
    s(
        "imageServiceEndpoint",
        Implemented,
        &[],
        "CRI image endpoint.",
    ),
    s(
        "failCgroupV1",
        NotImplemented,
        &["true"],
        "cgroup v1 hosts are not refused by this setting.",
    ),
    s(
        "userNamespaces.idsPerPod",
        NotImplemented,
        &["65536"],
        "user-namespaced pods are not supported.",
    ),
];

/// Warnings and refusals for the kubelet's flags (`(long name, raw value)` as given on the
/// command line) and its config file text.
pub fn check(given: &[(String, String)], file_text: Option<&str>) -> Findings {
    let mut out = proxy::settings::check_flags(FLAGS, given);
    if let Some(t) = file_text {
        out.extend(proxy::settings::check_file(
            FIELDS,
            "KubeletConfiguration v1beta1",
            t,
        ));
    }
    out
}

/// Upstream's expected kernel tunables (pkg/kubelet/cm setupKernelTunables): with
/// `protectKernelDefaults` the start fails when one differs.
pub const KERNEL_TUNABLES: &[(&str, i64)] = &[
    ("vm/overcommit_memory", 1),
    ("vm/panic_on_oom", 0),
    ("kernel/panic", 10),
    ("kernel/panic_on_oops", 1),
    ("kernel/keys/root_maxkeys", 1000000),
    ("kernel/keys/root_maxbytes", 25000000),
];

/// The tunables that differ (or cannot be read), in upstream's words; `read` gets a path
/// below /proc/sys.
pub fn kernel_tunable_problems(read: impl Fn(&str) -> Option<String>) -> Vec<String> {
    KERNEL_TUNABLES
        .iter()
        .filter_map(
            |(flag, want)| match read(flag).and_then(|t| t.trim().parse::<i64>().ok()) {
                Some(v) if v == *want => None,
                Some(v) => Some(format!(
                    "invalid kernel flag: {flag}, expected value: {want}, actual value: {v}"
                )),
                None => Some(format!("reading kernel flag {flag}: not readable")),
            },
        )
        .collect()
}

/// Whether /proc/swaps lists an active swap device (any line after the header).
pub fn swap_on(proc_swaps: &str) -> bool {
    proc_swaps.lines().skip(1).any(|l| !l.trim().is_empty())
}

/// Host checks upstream makes at start for `protectKernelDefaults` and `failSwapOn`. Reads
/// /proc only; never writes.
pub fn preflight(protect_kernel_defaults: bool, fail_swap_on: bool) -> Result<(), String> {
    if protect_kernel_defaults {
        let problems = kernel_tunable_problems(|p| {
            std::fs::read_to_string(std::path::Path::new("/proc/sys").join(p)).ok()
        });
        if !problems.is_empty() {
            return Err(format!("protectKernelDefaults: [{}]", problems.join(", ")));
        }
    }
    if fail_swap_on
        && std::fs::read_to_string("/proc/swaps")
            .map(|t| swap_on(&t))
            .unwrap_or(false)
    {
        return Err(
            "running with swap on is not supported, please disable swap or set --fail-swap-on flag to false"
                .into(),
        );
    }
    Ok(())
}

/// `docs/settings.md`, generated from the registries of both binaries.
pub fn settings_doc() -> String {
    let mut s = String::from(
        "# Settings\n\n\
         <!-- Generated from kubelet/src/settings.rs and proxy/src/settings.rs; do not edit.\n\
         Regenerate: UPDATE_SETTINGS_DOC=1 cargo test -p kubelet settings_doc -->\n\n\
         Every flag and config field the agent accepts, and what it does with it. No setting is\n\
         accepted and silently ignored:\n\n\
         - **Implemented**: works as upstream's (the note says where it differs in detail).\n\
         - **NotImplemented**: accepted, has no effect; one warning naming it is logged at start\n  \
         when it is set to a value other than the listed ones (upstream's default, or values whose\n  \
         behaviour the agent provides). Absent, `null`, empty values are never \"set\".\n\
         - **Refused**: security-relevant and not provided; the agent refuses to start when it is\n  \
         set to a value other than the listed ones.\n\n\
         Config fields the agent does not know are named in a warning at start.\n\n\
         The kubelet API (:10250): anonymous requests are served only with\n\
         `authentication.anonymous.enabled: true` and `authorization.mode: AlwaysAllow`. TokenReview\n\
         (webhook authentication), x509 client certificates and SubjectAccessReview (Webhook\n\
         authorization) are not implemented yet, so it fails closed: 401 `Unauthorized` when anonymous\n\
         is disabled, 403 `Forbidden (...)` under Webhook authorization. Standalone (no kubeconfig),\n\
         webhook authentication or authorization refuses to start, as upstream.\n\n",
    );
    s.push_str("## kubelet flags\n\n");
    s.push_str(&proxy::settings::markdown_table(FLAGS));
    s.push_str("\n## KubeletConfiguration (kubelet.config.k8s.io/v1beta1)\n\n");
    s.push_str(&proxy::settings::markdown_table(FIELDS));
    s.push_str("\n## kube-proxy flags\n\n");
    s.push_str(&proxy::settings::markdown_table(proxy::settings::FLAGS));
    s.push_str("\n## KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1)\n\n");
    s.push_str(&proxy::settings::markdown_table(proxy::settings::FIELDS));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn given(args: &[&str]) -> Vec<(String, String)> {
        let cmd = crate::flags::Flags::command();
        let m = cmd
            .clone()
            .try_get_matches_from(std::iter::once("kubelet").chain(args.iter().copied()))
            .unwrap();
        proxy::settings::given_flags(&cmd, &m)
    }

    #[test]
    fn settings_doc() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/settings.md");
        let want = super::settings_doc();
        if std::env::var_os("UPDATE_SETTINGS_DOC").is_some() {
            std::fs::write(&path, &want).unwrap();
            return;
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        if have != want {
            let first = have
                .lines()
                .zip(want.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(have.lines().count().min(want.lines().count()));
            panic!(
                "docs/settings.md is stale (first difference at line {}: have {:?}, want {:?}).\n\
                 Regenerate it: UPDATE_SETTINGS_DOC=1 cargo test -p kubelet settings_doc",
                first + 1,
                have.lines().nth(first),
                want.lines().nth(first)
            );
        }
    }

    #[test]
    fn every_flag_entry_is_a_real_flag_and_every_flag_has_an_entry() {
        let cmd = crate::flags::Flags::command();
        let longs: Vec<String> = cmd
            .get_arguments()
            .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
            .filter(|l| l != "--help")
            .collect();
        for e in FLAGS {
            assert!(
                longs.contains(&e.name.to_string()),
                "{} is not a flag",
                e.name
            );
        }
        for l in &longs {
            assert!(FLAGS.iter().any(|e| e.name == l), "flag {l} has no entry");
        }
        let mut names: Vec<_> = FLAGS.iter().map(|e| e.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), FLAGS.len(), "duplicate entries");
    }

    #[test]
    fn every_field_entry_is_known_to_serde() {
        for e in FIELDS {
            let top = e.name.split('.').next().unwrap();
            if matches!(top, "apiVersion" | "kind") {
                continue;
            }
            let cfg = crate::config::parse_file("t", &format!("{top}: null\n")).unwrap();
            assert!(
                !cfg.extra.contains_key(top),
                "{} is in the registry but KubeletConfiguration does not declare it",
                e.name
            );
        }
        // And every declared field has an entry (serialization lists the declared names).
        let declared =
            serde_json::to_value(crate::config::KubeletConfiguration::default()).unwrap();
        for k in declared.as_object().unwrap().keys() {
            assert!(
                FIELDS
                    .iter()
                    .any(|e| e.name == k || e.name.starts_with(&format!("{k}."))),
                "declared field {k} has no registry entry"
            );
        }
        let mut names: Vec<_> = FIELDS.iter().map(|e| e.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), FIELDS.len(), "duplicate entries");
    }

    #[test]
    fn kube_reserved_and_unknown_field_warn_exactly() {
        let f = check(
            &[],
            Some("kind: KubeletConfiguration\nkubeReserved: {cpu: 100m}\nfooBar: 1\n"),
        );
        let mut warnings = f.warnings.clone();
        warnings.sort();
        assert_eq!(
            warnings,
            vec![
                format!("field kubeReserved is set to {{\"cpu\":\"100m\"}} but has no effect in this agent: {NO_ALLOCATABLE}"),
                "unknown field \"fooBar\": not a KubeletConfiguration v1beta1 field this agent knows; ignored".to_string(),
            ]
        );
        assert!(f.refusals.is_empty());
    }

    #[test]
    fn defaults_are_not_set() {
        let text = "kind: KubeletConfiguration\nevictionPressureTransitionPeriod: 5m0s\n\
                    imageGCHighThresholdPercent: 85\nimageGCLowThresholdPercent: 80\n\
                    imageMinimumGCAge: 2m0s\nserializeImagePulls: true\nreadOnlyPort: 0\n\
                    enforceNodeAllocatable: [pods]\ncontainerLogMaxSize: 10Mi\nkubeReserved: {}\n\
                    cpuManagerPolicy: none\nseccompDefault: false\nlogging: {format: text, flushFrequency: 5s}\n";
        assert_eq!(check(&[], Some(text)), Findings::default());
        assert_eq!(
            check(
                &given(&[
                    "--serialize-image-pulls",
                    "--read-only-port=0",
                    "--image-gc-high-threshold=85"
                ]),
                None
            ),
            Findings::default()
        );
    }

    #[test]
    fn flags_warn_or_refuse() {
        let f = check(
            &given(&[
                "--eviction-hard=memory.available<100Mi",
                "--enforce-node-allocatable=pods,kube-reserved",
                "--fail-swap-on=false",
                "--serialize-image-pulls=false",
                "--max-pods=10",
            ]),
            None,
        );
        assert_eq!(f.warnings.len(), 3, "{f:#?}");
        for name in [
            "--eviction-hard",
            "--enforce-node-allocatable",
            "--serialize-image-pulls",
        ] {
            assert_eq!(
                f.warnings.iter().filter(|w| w.contains(name)).count(),
                1,
                "{name}: {f:#?}"
            );
        }
        let f = check(
            &given(&["--read-only-port=10255", "--seccomp-default"]),
            None,
        );
        assert_eq!(f.refusals.len(), 2, "{f:#?}");
        assert!(f.refusals.iter().any(|r| r.contains("--read-only-port")));
        assert!(f.refusals.iter().any(|r| r.contains("--seccomp-default")));
    }

    #[test]
    fn read_only_port_is_refused() {
        let f = check(&[], Some("readOnlyPort: 10255\n"));
        assert_eq!(f.refusals.len(), 1);
        assert!(f.refusals[0].contains("readOnlyPort") && f.refusals[0].contains("10255"));
    }

    #[test]
    fn kubeadm_config_warns_only_about_client_ca() {
        let f = check(&[], Some(crate::config::tests::KUBEADM_CONFIG));
        assert_eq!(f.refusals, Vec::<String>::new());
        assert_eq!(f.warnings.len(), 1, "{f:#?}");
        assert!(f.warnings[0].contains("authentication.x509.clientCAFile"));
        // kubeadm's command line: only flags that work.
        let g = given(&[
            "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf",
            "--kubeconfig=/etc/kubernetes/kubelet.conf",
            "--config=/var/lib/kubelet/config.yaml",
            "--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock",
            "--node-ip=10.0.0.5",
            "--pod-infra-container-image=registry.k8s.io/pause:3.10",
        ]);
        assert_eq!(check(&g, None), Findings::default());
    }

    #[test]
    fn kernel_tunables_checked_as_upstream() {
        let good = |p: &str| {
            KERNEL_TUNABLES
                .iter()
                .find(|(f, _)| *f == p)
                .map(|(_, v)| format!("{v}\n"))
        };
        assert!(kernel_tunable_problems(good).is_empty());
        let bad = |p: &str| match p {
            "kernel/panic" => Some("0\n".to_string()),
            other => good(other),
        };
        assert_eq!(
            kernel_tunable_problems(bad),
            vec!["invalid kernel flag: kernel/panic, expected value: 10, actual value: 0"]
        );
        assert!(swap_on(
            "Filename\tType\tSize\tUsed\tPriority\n/swapfile file 1 0 -2\n"
        ));
        assert!(!swap_on("Filename\tType\tSize\tUsed\tPriority\n"));
    }
}
