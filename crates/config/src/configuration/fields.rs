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
    ("registryPullQPS", Honoured),
    ("registryBurst", Honoured),
    ("imagePullCredentialsVerificationPolicy", WithoutEffect),
    ("preloadedImagesVerificationAllowlist", WithoutEffect),
    ("eventRecordQPS", Honoured),
    ("eventBurst", Honoured),
    ("enableDebuggingHandlers", Honoured),
    ("enableContentionProfiling", WithoutEffect),
    ("healthzPort", Honoured),
    ("healthzBindAddress", Honoured),
    ("oomScoreAdj", Honoured),
    ("clusterDomain", Honoured),
    ("clusterDNS", Honoured),
    ("streamingConnectionIdleTimeout", Honoured),
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
    ("enableControllerAttachDetach", DefaultOnly),
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
    ("providerID", Honoured),
    ("kernelMemcgNotification", WithoutEffect),
    ("logging", Honoured),
    ("enableSystemLogHandler", Honoured),
    ("enableSystemLogQuery", WithoutEffect),
    ("shutdownGracePeriod", WithoutEffect),
    ("shutdownGracePeriodCriticalPods", WithoutEffect),
    ("shutdownGracePeriodByPodPriority", WithoutEffect),
    ("crashLoopBackOff", DefaultOnly),
    ("reservedMemory", WithoutEffect),
    ("enableProfilingHandler", WithoutEffect),
    ("enableDebugFlagsHandler", Honoured),
    ("seccompDefault", DefaultOnly),
    ("memoryThrottlingFactor", WithoutEffect),
    ("memoryReservationPolicy", WithoutEffect),
    ("registerWithTaints", Honoured),
    ("registerNode", Honoured),
    ("tracing", WithoutEffect),
    ("localStorageCapacityIsolation", Honoured),
    ("containerRuntimeEndpoint", Honoured),
    ("imageServiceEndpoint", Honoured),
    ("failCgroupV1", Honoured),
    ("userNamespaces", WithoutEffect),
];

/// What `field` gets, when it is one of upstream's.
pub fn support(field: &str) -> Option<Support> {
    FIELDS.iter().find(|(name, _)| *name == field).map(|(_, support)| *support)
}

/// One sentence on what an honoured field (top-level, or dotted for a nested one) does, for
/// `--help`; `None` for a field without one.
pub fn describe(field: &str) -> Option<&'static str> {
    let sentence = match field {
        "enableServer" => "Serve the kubelet API (TLS, authenticated and authorized) on address:port.",
        "enableDebuggingHandlers" => {
            "Serve run, exec, attach, port-forward, container logs and running pods on the kubelet API (true)."
        }
        "streamingConnectionIdleTimeout" => {
            "Close an exec, attach or port-forward session idle this long (a Go duration, 4h0m0s)."
        }
        "failSwapOn" => "Refuse to start when swap is on.",
        "staticPodPath" => "The directory (or file) of static pod manifests to run.",
        "syncFrequency" => "How often running pods are synced again without a change (a Go duration, 1m0s).",
        "fileCheckFrequency" => "How often the static pod path is read again (20s).",
        "httpCheckFrequency" => "How often the static pod URL is fetched again (20s).",
        "staticPodURL" => "An http:// URL serving static pod manifests.",
        "staticPodURLHeader" => "Headers sent with every static pod URL request.",
        "address" => "The IP address the kubelet API and the read-only port listen on (0.0.0.0).",
        "port" => "The kubelet API's port (10250); 0 turns it off.",
        "readOnlyPort" => "The unauthenticated read-only port (0: off).",
        "containerRuntimeEndpoint" => "The CRI runtime's endpoint (unix:///run/containerd/containerd.sock).",
        "imageServiceEndpoint" => "The CRI image service's endpoint, when not the runtime's.",
        "authentication.anonymous.enabled" => "Let requests nothing authenticates through as system:anonymous.",
        "authentication.webhook.enabled" => "Authenticate bearer tokens with the API server's TokenReview.",
        "authentication.webhook.cacheTTL" => "How long a TokenReview's answer is kept (2m0s).",
        "authentication.x509.clientCAFile" => "CA certificates whose client certificates authenticate callers.",
        "authorization.mode" => "Webhook (a SubjectAccessReview per request) or AlwaysAllow.",
        "authorization.webhook.cacheAuthorizedTTL" => "How long an allowed access review is kept (5m0s).",
        "authorization.webhook.cacheUnauthorizedTTL" => "How long a denied access review is kept (30s).",
        "tlsCertFile" => "The kubelet API's serving certificate (PEM); self-signed in --cert-dir when unset.",
        "tlsPrivateKeyFile" => "The serving certificate's private key (PEM).",
        "serverTLSBootstrap" => "Ask the API server for the kubelet API's serving certificate, and renew it.",
        "tlsCipherSuites" => "The TLS 1.2 cipher suites allowed, by Go's names.",
        "tlsMinVersion" => "The lowest TLS version: VersionTLS12 or VersionTLS13.",
        "rotateCertificates" => "Renew the client certificate before it expires, through the API server.",
        "healthzPort" => "The /healthz port (10248); 0 turns it off.",
        "healthzBindAddress" => "The IP address /healthz listens on (127.0.0.1).",
        "oomScoreAdj" => "The agent's own oom_score_adj (-999).",
        "clusterDomain" => "The cluster's DNS domain, searched by ClusterFirst pods.",
        "clusterDNS" => "The cluster DNS servers' IPs, for ClusterFirst pods.",
        "nodeStatusUpdateFrequency" => "How often the Node's status is computed (10s).",
        "imageMinimumGCAge" => "How old an unused image must be before image GC may remove it (2m0s).",
        "imageGCHighThresholdPercent" => "Image filesystem use at which image GC starts (85).",
        "imageGCLowThresholdPercent" => "Image filesystem use image GC brings it down to (80).",
        "cgroupDriver" => "The cgroup driver: cgroupfs only.",
        "cgroupRoot" => "The cgroup the pods' kubepods hierarchy goes under.",
        "runtimeRequestTimeout" => "The timeout of every CRI call but long-running ones (2m0s).",
        "maxPods" => "The most pods this node runs (110).",
        "podPidsLimit" => "The most processes in one pod (-1: no limit).",
        "resolvConf" => "The resolver configuration pods' DNS starts from (/etc/resolv.conf; empty: none).",
        "containerLogMaxSize" => "The size at which a container's log is rotated (10Mi).",
        "containerLogMaxFiles" => "The most log files a container keeps (5).",
        "allowedUnsafeSysctls" => "Unsafe sysctls (or prefix* patterns) pods may set.",
        "nodeStatusMaxImages" => "The most images the Node's status lists (50; -1: all).",
        "kubeAPIQPS" => "The API client's average requests per second (50).",
        "kubeAPIBurst" => "The API client's burst of requests (100).",
        "eventRecordQPS" => "The event client's average event creations per second, beside kubeAPIQPS (50).",
        "eventBurst" => "The event client's burst of event creations (100).",
        "serializeImagePulls" => "Pull one image at a time.",
        "registryPullQPS" => {
            "Image pulls a second; a pull beyond them fails with 'pull QPS exceeded' (5; 0: no limit)."
        }
        "localStorageCapacityIsolation" => {
            "Give the node ephemeral-storage capacity, admit pods against it and evict past emptyDir sizeLimits and ephemeral-storage limits (true)."
        }
        "registryBurst" => "Image pulls a quiet node may start at once, within registryPullQPS (10).",
        "providerID" => "The Node's spec.providerID, by which a cloud's controllers know its machine.",
        "enableSystemLogHandler" => "Serve /var/log at /logs/ on the kubelet API, with the debugging handlers (true).",
        "enableDebugFlagsHandler" => "Take a new log verbosity at /debug/flags/v on the kubelet API (true).",
        "evictionHard" => "Thresholds that evict pods at once (memory.available<100Mi,...).",
        "evictionSoft" => "Thresholds that evict pods once crossed for their grace period.",
        "evictionSoftGracePeriod" => "Each soft threshold's grace period.",
        "evictionPressureTransitionPeriod" => "How long a pressure condition outlasts its threshold (5m0s).",
        "evictionMaxPodGracePeriod" => "The most grace a pod evicted for a soft threshold gets.",
        "evictionMinimumReclaim" => "How much beyond a threshold must be free again.",
        "systemReserved" => "CPU and memory set aside for the operating system.",
        "kubeReserved" => "CPU and memory set aside for the kubelet and the runtime.",
        "enforceNodeAllocatable" => "Which limits are enforced: pods, system-reserved, kube-reserved, or none.",
        "systemReservedCgroup" => "The system daemons' cgroup, limited to systemReserved when enforced.",
        "kubeReservedCgroup" => "The Kubernetes daemons' cgroup, limited to kubeReserved when enforced.",
        "registerNode" => "With --kubeconfig, register the Node with the API server.",
        "registerWithTaints" => "The taints the Node registers with (key=value:Effect).",
        _ => return None,
    };
    Some(sentence)
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
        "cgroupsPerQOS" | "enableControllerAttachDetach" => value.as_bool() == Some(true),
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
        "enableControllerAttachDetach" => {
            "enableControllerAttachDetach: true (the attach/detach controller attaches volumes, not the node)"
        }
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
