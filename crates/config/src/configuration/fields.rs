//! Every field of upstream's `KubeletConfiguration` (`kubelet.config.k8s.io/v1beta1`, from
//! `staging/src/k8s.io/kubelet/config/v1beta1/types.go`) and what this agent does with it.

use serde_json::Value;

/// What this agent does with a field of upstream's `KubeletConfiguration`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Support {
    /// Read and honoured (some values may still be refused, such as `cgroupDriver: systemd`).
    Honoured,
    /// Accepted and named in one start-up warning: it has no effect in this agent (yet).
    WithoutEffect,
    /// Accepted with a value that asks for nothing this agent lacks (upstream's default, in
    /// general); any other value is an error naming the field and line, since the agent would
    /// silently not do what it asks.
    DefaultOnly,
}

use Support::{DefaultOnly, Honoured, WithoutEffect};

/// Every top-level field of upstream's `KubeletConfiguration` but `apiVersion` and `kind`, in
/// upstream's order, with what this agent does with it.
pub const FIELDS: &[(&str, Support)] = &[
    ("enableServer", Honoured),
    ("staticPodPath", Honoured),
    ("podLogsDir", Honoured),
    ("syncFrequency", Honoured),
    ("fileCheckFrequency", Honoured),
    ("httpCheckFrequency", Honoured),
    ("staticPodURL", Honoured),
    ("staticPodURLHeader", Honoured),
    ("address", Honoured),
    ("port", Honoured),
    ("readOnlyPort", Honoured),
    ("tlsCertFile", Honoured),
    ("tlsPrivateKeyFile", Honoured),
    ("tlsCipherSuites", Honoured),
    ("tlsCurvePreferences", WithoutEffect),
    ("tlsMinVersion", Honoured),
    ("rotateCertificates", Honoured),
    ("serverTLSBootstrap", Honoured),
    ("authentication", Honoured),
    ("authorization", Honoured),
    ("registryPullQPS", WithoutEffect),
    ("registryBurst", WithoutEffect),
    ("imagePullCredentialsVerificationPolicy", WithoutEffect),
    ("preloadedImagesVerificationAllowlist", WithoutEffect),
    ("eventRecordQPS", WithoutEffect),
    ("eventBurst", WithoutEffect),
    ("enableDebuggingHandlers", WithoutEffect),
    ("enableContentionProfiling", WithoutEffect),
    ("healthzPort", Honoured),
    ("healthzBindAddress", Honoured),
    ("oomScoreAdj", Honoured),
    ("clusterDomain", Honoured),
    ("clusterDNS", Honoured),
    ("streamingConnectionIdleTimeout", WithoutEffect),
    ("nodeStatusUpdateFrequency", Honoured),
    ("nodeStatusReportFrequency", Honoured),
    ("nodeLeaseDurationSeconds", Honoured),
    ("imageMinimumGCAge", Honoured),
    ("imageMaximumGCAge", Honoured),
    ("imageGCHighThresholdPercent", Honoured),
    ("imageGCLowThresholdPercent", Honoured),
    ("volumeStatsAggPeriod", WithoutEffect),
    ("kubeletCgroups", WithoutEffect),
    ("systemCgroups", WithoutEffect),
    ("cgroupRoot", Honoured),
    ("cgroupsPerQOS", DefaultOnly),
    ("cgroupDriver", Honoured),
    ("cpuManagerPolicy", DefaultOnly),
    ("singleProcessOOMKill", WithoutEffect),
    ("cpuManagerPolicyOptions", WithoutEffect),
    ("cpuManagerReconcilePeriod", WithoutEffect),
    ("draManagerReconcilePeriod", WithoutEffect),
    ("memoryManagerPolicy", DefaultOnly),
    ("topologyManagerPolicy", DefaultOnly),
    ("topologyManagerScope", WithoutEffect),
    ("topologyManagerPolicyOptions", WithoutEffect),
    ("qosReserved", WithoutEffect),
    ("runtimeRequestTimeout", Honoured),
    ("hairpinMode", WithoutEffect),
    ("maxPods", Honoured),
    ("podCIDR", WithoutEffect),
    ("podPidsLimit", Honoured),
    ("resolvConf", Honoured),
    ("runOnce", DefaultOnly),
    ("cpuCFSQuota", DefaultOnly),
    ("cpuCFSQuotaPeriod", DefaultOnly),
    ("nodeStatusMaxImages", Honoured),
    ("maxOpenFiles", WithoutEffect),
    ("contentType", WithoutEffect),
    ("kubeAPIQPS", Honoured),
    ("kubeAPIBurst", Honoured),
    ("serializeImagePulls", Honoured),
    ("maxParallelImagePulls", Honoured),
    ("evictionHard", Honoured),
    ("evictionSoft", Honoured),
    ("evictionSoftGracePeriod", Honoured),
    ("evictionPressureTransitionPeriod", Honoured),
    ("evictionMaxPodGracePeriod", Honoured),
    ("evictionMinimumReclaim", Honoured),
    ("mergeDefaultEvictionSettings", Honoured),
    ("podsPerCore", DefaultOnly),
    ("enableControllerAttachDetach", WithoutEffect),
    ("protectKernelDefaults", DefaultOnly),
    ("makeIPTablesUtilChains", WithoutEffect),
    ("iptablesMasqueradeBit", WithoutEffect),
    ("iptablesDropBit", WithoutEffect),
    ("featureGates", WithoutEffect),
    ("failSwapOn", Honoured),
    ("memorySwap", DefaultOnly),
    ("containerLogMaxSize", Honoured),
    ("containerLogMaxFiles", Honoured),
    ("containerLogMaxWorkers", Honoured),
    ("containerLogMonitorInterval", Honoured),
    ("configMapAndSecretChangeDetectionStrategy", WithoutEffect),
    ("systemReserved", Honoured),
    ("kubeReserved", Honoured),
    ("reservedSystemCPUs", WithoutEffect),
    ("showHiddenMetricsForVersion", WithoutEffect),
    ("systemReservedCgroup", Honoured),
    ("kubeReservedCgroup", Honoured),
    ("enforceNodeAllocatable", Honoured),
    ("allowedUnsafeSysctls", Honoured),
    ("volumePluginDir", WithoutEffect),
    ("providerID", WithoutEffect),
    ("kernelMemcgNotification", WithoutEffect),
    ("logging", Honoured),
    ("enableSystemLogHandler", WithoutEffect),
    ("enableSystemLogQuery", WithoutEffect),
    ("shutdownGracePeriod", WithoutEffect),
    ("shutdownGracePeriodCriticalPods", WithoutEffect),
    ("shutdownGracePeriodByPodPriority", WithoutEffect),
    ("crashLoopBackOff", DefaultOnly),
    ("reservedMemory", WithoutEffect),
    ("enableProfilingHandler", WithoutEffect),
    ("enableDebugFlagsHandler", WithoutEffect),
    ("seccompDefault", DefaultOnly),
    ("memoryThrottlingFactor", WithoutEffect),
    ("memoryReservationPolicy", WithoutEffect),
    ("registerWithTaints", Honoured),
    ("registerNode", Honoured),
    ("tracing", WithoutEffect),
    ("localStorageCapacityIsolation", WithoutEffect),
    ("containerRuntimeEndpoint", Honoured),
    ("imageServiceEndpoint", Honoured),
    ("failCgroupV1", Honoured),
    ("userNamespaces", WithoutEffect),
];

/// What `field` gets, when it is one of upstream's.
pub fn support(field: &str) -> Option<Support> {
    FIELDS.iter().find(|(name, _)| *name == field).map(|(_, support)| *support)
}

/// The upstream field closest to the unknown `field`, when one is close enough to be a typo.
pub(crate) fn closest(field: &str) -> Option<&'static str> {
    FIELDS
        .iter()
        .map(|(name, _)| (*name, strsim::jaro_winkler(&field.to_ascii_lowercase(), &name.to_ascii_lowercase())))
        .filter(|(_, score)| *score > 0.85)
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(name, _)| name)
}

/// Checks a [`Support::DefaultOnly`] field's value: `Err` says what the agent would not do.
pub(crate) fn check_default(field: &str, value: &Value) -> Result<(), String> {
    let text = value.as_str().map(str::to_ascii_lowercase);
    let ok = match field {
        "cgroupsPerQOS" => value.as_bool() == Some(true),
        "cpuManagerPolicy" | "topologyManagerPolicy" | "memoryManagerPolicy" => {
            matches!(text.as_deref(), Some("" | "none"))
        }
        "runOnce" | "protectKernelDefaults" | "seccompDefault" => value.as_bool() == Some(false),
        "cpuCFSQuota" => value.as_bool() == Some(true),
        "cpuCFSQuotaPeriod" => {
            value.as_str().and_then(|d| super::parse_duration(d).ok()) == Some(std::time::Duration::from_millis(100))
        }
        "podsPerCore" => value.as_i64() == Some(0),
        "memorySwap" => {
            let behaviour = value.get("swapBehavior").and_then(Value::as_str).unwrap_or_default();
            value.as_object().is_some_and(|o| o.keys().all(|k| k == "swapBehavior"))
                && matches!(behaviour, "" | "NoSwap")
        }
        "crashLoopBackOff" => value.as_object().is_some_and(serde_json::Map::is_empty),
        _ => false,
    };
    if ok || value.is_null() {
        return Ok(());
    }
    Err(format!("{value} is not supported: this agent only runs with {}", required(field)))
}

/// What a [`Support::DefaultOnly`] field must say, in words.
fn required(field: &str) -> &'static str {
    match field {
        "cgroupsPerQOS" => "cgroupsPerQOS: true (pods in QoS cgroups)",
        "cpuManagerPolicy" => "the none CPU manager policy (no exclusive CPUs)",
        "topologyManagerPolicy" => "the none topology manager policy (no NUMA alignment)",
        "memoryManagerPolicy" => "the None memory manager policy (no NUMA memory pinning)",
        "runOnce" => "runOnce: false",
        "protectKernelDefaults" => "protectKernelDefaults: false (kernel flags are not checked)",
        "seccompDefault" => "seccompDefault: false (pods without a seccomp profile run Unconfined)",
        "cpuCFSQuota" => "CFS quotas for CPU limits (cpuCFSQuota: true)",
        "cpuCFSQuotaPeriod" => "the 100ms CFS period",
        "podsPerCore" => "no per-core pod limit (0)",
        "memorySwap" => "swapBehavior NoSwap",
        "crashLoopBackOff" => "upstream's crash-loop backoff (10 s doubling to 5 min)",
        _ => "upstream's default",
    }
}
