//! The configuration written back as upstream's `kubelet.config.k8s.io/v1beta1` object, for
//! `/configz`: upstream's field names, Go's durations and quantities, and the defaults applied.

use std::{path::Path, time::Duration};

use kubelet_core::clock::format_duration;
use serde_json::{Value, json};

use super::{AuthorizationMode, KubeletConfiguration};

/// What the fields this agent accepts only at upstream's defaults
/// ([`Support::DefaultOnly`](super::Support::DefaultOnly)) are, as upstream writes them.
fn default_only_fields() -> Value {
    json!({
        "cgroupsPerQOS": true,
        "enableControllerAttachDetach": true,
        "cpuManagerPolicy": "none",
        "memoryManagerPolicy": "None",
        "topologyManagerPolicy": "none",
        "cpuCFSQuota": true,
        "cpuCFSQuotaPeriod": "100ms",
        "podsPerCore": 0,
        "protectKernelDefaults": false,
        "seccompDefault": false,
        "memorySwap": {},
    })
}

impl KubeletConfiguration {
    /// The configuration in force as upstream's v1beta1 object (without `apiVersion` and `kind`,
    /// as upstream's `/configz` has it): every field this agent honours with its value or default,
    /// and the fields it takes only at upstream's default with that default. Fields without
    /// effect here are left out, since nothing applies them.
    pub fn to_v1beta1(&self) -> Value {
        let mut fields = serde_json::Map::new();
        for group in [
            self.pod_sources(),
            self.serving(),
            self.runtime(),
            self.node_status(),
            self.resources(),
            self.garbage_and_eviction(),
            default_only_fields(),
        ] {
            if let Value::Object(group) = group {
                fields.extend(group);
            }
        }
        if let Some(max) = self.max_parallel_image_pulls {
            fields.insert("maxParallelImagePulls".to_owned(), max.into());
        }
        Value::Object(fields)
    }

    fn pod_sources(&self) -> Value {
        json!({
            "staticPodPath": path(self.static_pod_path.as_deref()),
            "staticPodURL": self.static_pod_url.clone().unwrap_or_default(),
            "staticPodURLHeader": self.static_pod_url_header,
            "syncFrequency": duration(self.sync_frequency),
            "fileCheckFrequency": duration(self.file_check_frequency),
            "httpCheckFrequency": duration(self.http_check_frequency),
            "registerNode": self.register_node,
            "registerWithTaints": self.register_with_taints,
            "providerID": self.provider_id.clone().unwrap_or_default(),
        })
    }

    fn serving(&self) -> Value {
        let server = &self.server;
        let authentication = &server.authentication;
        let authorization = &server.authorization;
        let mode = match authorization.mode {
            AuthorizationMode::AlwaysAllow => "AlwaysAllow",
            AuthorizationMode::Webhook => "Webhook",
        };
        json!({
            "enableServer": server.enable_server,
            "enableDebuggingHandlers": server.enable_debugging_handlers,
            "enableSystemLogHandler": self.enable_system_log_handler,
            "enableDebugFlagsHandler": self.enable_debug_flags_handler,
            "streamingConnectionIdleTimeout": duration(server.streaming_connection_idle_timeout),
            "address": self.address.to_string(),
            "port": server.port,
            "readOnlyPort": self.read_only_port,
            "healthzPort": self.healthz_port,
            "healthzBindAddress": self.healthz_bind_address.to_string(),
            "tlsCertFile": path(server.tls_cert_file.as_deref()),
            "tlsPrivateKeyFile": path(server.tls_private_key_file.as_deref()),
            "tlsCipherSuites": server.tls_cipher_suites,
            "tlsMinVersion": server.tls_min_version.clone().unwrap_or_default(),
            "rotateCertificates": self.rotate_certificates,
            "serverTLSBootstrap": self.server_tls_bootstrap,
            "authentication": {
                "x509": {"clientCAFile": path(authentication.client_ca_file.as_deref())},
                "webhook": {
                    "enabled": authentication.webhook_enabled,
                    "cacheTTL": duration(authentication.webhook_cache_ttl),
                },
                "anonymous": {"enabled": authentication.anonymous_enabled},
            },
            "authorization": {
                "mode": mode,
                "webhook": {
                    "cacheAuthorizedTTL": duration(authorization.webhook_cache_authorized_ttl),
                    "cacheUnauthorizedTTL": duration(authorization.webhook_cache_unauthorized_ttl),
                },
            },
        })
    }

    fn runtime(&self) -> Value {
        json!({
            "containerRuntimeEndpoint": self.container_runtime_endpoint,
            "imageServiceEndpoint": self.image_service_endpoint.clone().unwrap_or_default(),
            "runtimeRequestTimeout": duration(self.runtime_request_timeout),
            "serializeImagePulls": self.serialize_image_pulls,
            "registryPullQPS": self.registry_pull_qps,
            "localStorageCapacityIsolation": self.local_storage_capacity_isolation,
            "registryBurst": self.registry_burst,
            "podLogsDir": self.pod_logs_dir.display().to_string(),
            "containerLogMaxSize": self.container_log_max_size.map_or_else(|| "-1".to_owned(), quantity_of_bytes),
            "containerLogMaxFiles": self.container_log_max_files,
            "containerLogMaxWorkers": self.container_log_max_workers,
            "containerLogMonitorInterval": duration(self.container_log_monitor_interval),
            "clusterDomain": self.cluster_domain,
            "clusterDNS": self.cluster_dns.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "resolvConf": path(self.resolv_conf.as_deref()),
            "allowedUnsafeSysctls": self.allowed_unsafe_sysctls,
            "logging": {
                "format": self.logging_format.as_deref().unwrap_or("text"),
                "verbosity": self.verbosity.unwrap_or(0),
            },
        })
    }

    fn node_status(&self) -> Value {
        let max_images = self.node_status_max_images.map_or(-1, |max| i64::try_from(max).unwrap_or(i64::MAX));
        json!({
            "nodeStatusUpdateFrequency": duration(self.node_status_update_frequency),
            "nodeStatusReportFrequency": duration(self.node_status_report_frequency),
            "nodeLeaseDurationSeconds": self.node_lease_duration_seconds,
            "nodeStatusMaxImages": max_images,
            "kubeAPIQPS": whole_if_whole(self.kube_api_qps),
            "kubeAPIBurst": self.kube_api_burst,
            "eventRecordQPS": whole_if_whole(self.event_record_qps),
            "eventBurst": self.event_burst,
        })
    }

    fn resources(&self) -> Value {
        json!({
            "maxPods": self.max_pods,
            "podPidsLimit": self.pod_pids_limit.unwrap_or(-1),
            "oomScoreAdj": self.oom_score_adj,
            "failSwapOn": self.fail_swap_on,
            "failCgroupV1": self.fail_cgroup_v1,
            "cgroupRoot": self.cgroup_root,
            "cgroupDriver": self.cgroup_driver,
            "systemReserved": self.system_reserved,
            "kubeReserved": self.kube_reserved,
            "systemReservedCgroup": self.system_reserved_cgroup,
            "kubeReservedCgroup": self.kube_reserved_cgroup,
            "enforceNodeAllocatable": enforced_or_none(&self.enforce_node_allocatable),
        })
    }

    fn garbage_and_eviction(&self) -> Value {
        json!({
            "imageMinimumGCAge": duration(self.image_minimum_gc_age),
            "imageMaximumGCAge": duration(self.image_maximum_gc_age.unwrap_or_default()),
            "imageGCHighThresholdPercent": self.image_gc_high_threshold_percent,
            "imageGCLowThresholdPercent": self.image_gc_low_threshold_percent,
            "evictionHard": self.eviction_hard,
            "evictionSoft": self.eviction_soft,
            "evictionSoftGracePeriod": self.eviction_soft_grace_period,
            "evictionPressureTransitionPeriod": duration(self.eviction_pressure_transition_period),
            "evictionMaxPodGracePeriod": self.eviction_max_pod_grace_period,
            "evictionMinimumReclaim": self.eviction_minimum_reclaim,
        })
    }
}

/// A duration as Go writes it.
fn duration(duration: Duration) -> Value {
    Value::String(format_duration(duration))
}

/// A path, or `""` for none, as upstream's string fields have it.
fn path(path: Option<&Path>) -> String {
    path.map(|p| p.display().to_string()).unwrap_or_default()
}

/// A whole number as an integer, as upstream's `int32` fields are written.
fn whole_if_whole(value: f64) -> Value {
    // Reason: the cast is taken only for whole values inside i64's range.
    #[allow(clippy::cast_possible_truncation)]
    if value.fract() == 0.0 && value.abs() < 9.0e15 { Value::from(value as i64) } else { Value::from(value) }
}

/// Bytes as a quantity in the largest binary unit that divides them (`10Mi`).
fn quantity_of_bytes(bytes: u64) -> String {
    let units = [("Ti", 1u64 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)];
    match units.iter().find(|(_, size)| bytes != 0 && bytes.is_multiple_of(*size)) {
        Some((suffix, size)) => format!("{}{suffix}", bytes / size),
        None => bytes.to_string(),
    }
}

/// `enforceNodeAllocatable` as upstream keeps it: `none` when nothing is enforced.
fn enforced_or_none(enforced: &[String]) -> Vec<String> {
    if enforced.is_empty() { vec!["none".to_owned()] } else { enforced.to_vec() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::configuration::{FIELDS, Support};

    fn parse(body: &str) -> KubeletConfiguration {
        let text = format!("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{body}");
        KubeletConfiguration::from_yaml(&text).unwrap()
    }

    #[test]
    fn every_honoured_and_default_only_field_is_written_and_nothing_else() {
        let written = parse("").to_v1beta1();
        let mut expected: Vec<&str> = FIELDS
            .iter()
            .filter(|(name, support)| {
                *support != Support::WithoutEffect
                    && !matches!(
                        *name,
                        "mergeDefaultEvictionSettings" | "maxParallelImagePulls" | "runOnce" | "crashLoopBackOff"
                    )
            })
            .map(|(name, _)| *name)
            .collect();
        expected.sort_unstable();
        let mut keys: Vec<&str> = written.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, expected);
    }

    #[test]
    fn defaults_are_written_as_upstream_writes_them() {
        let written = parse("").to_v1beta1();
        assert_eq!(written["syncFrequency"], "1m0s");
        assert_eq!(written["fileCheckFrequency"], "20s");
        assert_eq!(written["nodeStatusReportFrequency"], "5m0s");
        assert_eq!(written["runtimeRequestTimeout"], "2m0s");
        assert_eq!(written["imageMaximumGCAge"], "0s");
        assert_eq!(written["authentication"]["webhook"]["cacheTTL"], "2m0s");
        assert_eq!(written["authorization"]["mode"], "Webhook");
        assert_eq!(written["authorization"]["webhook"]["cacheUnauthorizedTTL"], "30s");
        assert_eq!(written["containerLogMaxSize"], "10Mi");
        assert_eq!(written["podPidsLimit"], -1);
        assert_eq!(written["kubeAPIQPS"], 50);
        assert_eq!(written["port"], 10250);
        assert_eq!(written["address"], "0.0.0.0");
        assert_eq!(written["enforceNodeAllocatable"], json!(["pods"]));
        assert_eq!(written["evictionHard"]["memory.available"], "100Mi");
        assert_eq!(written["cgroupsPerQOS"], true);
        assert_eq!(written["resolvConf"], "/etc/resolv.conf");
    }

    #[test]
    fn set_values_are_written_back_and_read_again_to_the_same_configuration() {
        let config = parse(
            "syncFrequency: 90s\nmaxPods: 20\nclusterDNS: [10.0.0.10]\nclusterDomain: cluster.local\n\
             containerLogMaxSize: 5Mi\npodPidsLimit: 300\nkubeAPIQPS: 12.5\nenforceNodeAllocatable: [none]\n\
             authorization: {mode: AlwaysAllow}\nauthentication: {webhook: {enabled: false}, x509: {clientCAFile: /pki/ca.crt}}\n\
             registerWithTaints: [{key: dedicated, value: edge, effect: NoSchedule}]\nserializeImagePulls: false\n\
             maxParallelImagePulls: 3\nimageMaximumGCAge: 1h\nstaticPodPath: /etc/kubernetes/manifests\n\
             logging: {format: json, verbosity: 2}\n",
        );
        let written = config.to_v1beta1();
        assert_eq!(written["syncFrequency"], "1m30s");
        assert_eq!(written["kubeAPIQPS"], 12.5);
        assert_eq!(written["enforceNodeAllocatable"], json!(["none"]));
        assert_eq!(written["maxParallelImagePulls"], 3);
        assert_eq!(written["registerWithTaints"][0]["key"], "dedicated");
        let mut document = written.as_object().cloned().unwrap_or_default();
        document.insert("apiVersion".to_owned(), super::super::API_VERSION.into());
        document.insert("kind".to_owned(), super::super::KIND.into());
        let text = serde_json::to_string(&document).unwrap();
        let read_again = KubeletConfiguration::from_yaml(&text).unwrap();
        assert_eq!(read_again, config);
    }

    #[test]
    fn quantities_take_the_largest_binary_unit_that_divides_them() {
        assert_eq!(quantity_of_bytes(10 << 20), "10Mi");
        assert_eq!(quantity_of_bytes(3 << 10), "3Ki");
        assert_eq!(quantity_of_bytes(1000), "1000");
    }
}
