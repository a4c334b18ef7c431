//! Every flag of upstream's kubelet (`cmd/kubelet/app/options/options.go`, the logging flags and
//! `pkg/kubelet/config/flags.go`) beyond the few `RunArgs` declares itself, and what this agent
//! does with each.
//!
//! A flag backed by a `KubeletConfiguration` field sets that field over the configuration file,
//! so it gets the field's outcome ([`config::configuration::Support`]): honoured, accepted
//! without effect (named in the start-up warning), or refused when its value asks for what the
//! agent lacks. A flag without a field names a feature this agent does not have yet and is
//! named in the start-up warning; one that upstream deprecated and ignores prints upstream's
//! deprecation line.

use clap::{Arg, ArgAction, ArgMatches, Command, parser::ValueSource};
use config::configuration::Support;
use serde_json::{Map, Value};

/// How a flag's text becomes a configuration value (pflag's value types).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `--flag` or `--flag=false`.
    Bool,
    /// A whole number.
    Int,
    /// Text, durations included (the configuration reads Go's duration syntax).
    Text,
    /// Comma-separated, repeatable: a list.
    List,
    /// `key=value` pairs, comma-separated, repeatable: a map.
    Map,
    /// `key=true` pairs: a map of booleans (`--feature-gates`).
    BoolMap,
    /// `signal<quantity>` pairs (`--eviction-hard`): a map.
    LangleMap,
    /// `name:value` pairs, repeatable, names may repeat (`--manifest-url-header`): a map of lists.
    Headers,
    /// `key=value:Effect` items, comma-separated (`--register-with-taints`): a list of taints.
    Taints,
}

/// What a flag does here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Effect {
    /// Sets this `KubeletConfiguration` field, over the file.
    Field(&'static str),
    /// A feature this agent does not have (yet): named in the start-up warning.
    Missing,
    /// Deprecated upstream with this message, and without effect here.
    Deprecated(&'static str),
}

use Effect::{Deprecated, Field, Missing};
use Kind::{Bool, BoolMap, Headers, Int, LangleMap, List, Map as Pairs, Taints, Text};

const EVICTION_DEPRECATION: &str =
    "Use --eviction-hard or --eviction-soft instead. Will be removed in a future version.";
const NO_EFFECT: &str = "This flag has no effect and will be removed in a future version.";

/// Upstream's flags that `RunArgs` does not declare, with their value kind and effect.
pub(crate) const FLAGS: &[(&str, Kind, Effect)] = &[
    // KubeletFlags.
    ("seccomp-default", Bool, Field("seccompDefault")),
    ("lock-file", Text, Missing),
    ("exit-on-lock-contention", Bool, Missing),
    ("minimum-container-ttl-duration", Text, Deprecated(EVICTION_DEPRECATION)),
    ("maximum-dead-containers-per-container", Int, Deprecated(EVICTION_DEPRECATION)),
    ("maximum-dead-containers", Int, Deprecated(EVICTION_DEPRECATION)),
    ("register-schedulable", Bool, Deprecated("will be removed in a future version")),
    ("keep-terminated-pod-volumes", Bool, Deprecated("will be removed in a future version")),
    ("experimental-mounter-path", Text, Deprecated("will be removed in 1.25 or later. in favor of using CSI.")),
    (
        "cloud-config",
        Text,
        Deprecated("will be removed in 1.25 or later, in favor of removing cloud provider code from Kubelet."),
    ),
    ("experimental-allocatable-ignore-eviction", Bool, Deprecated("will be removed in 1.25 or later.")),
    // ContainerRuntimeOptions.
    ("runtime-cgroups", Text, Missing),
    (
        "pod-infra-container-image",
        Text,
        Deprecated("will be removed in 1.35. Image garbage collector will get sandbox image information from CRI."),
    ),
    ("image-credential-provider-config", Text, Missing),
    ("image-credential-provider-bin-dir", Text, Missing),
    // KubeletConfiguration flags.
    ("enable-server", Bool, Field("enableServer")),
    ("fail-swap-on", Bool, Field("failSwapOn")),
    ("pod-manifest-path", Text, Field("staticPodPath")),
    ("sync-frequency", Text, Field("syncFrequency")),
    ("file-check-frequency", Text, Field("fileCheckFrequency")),
    ("http-check-frequency", Text, Field("httpCheckFrequency")),
    ("manifest-url", Text, Field("staticPodURL")),
    ("manifest-url-header", Headers, Field("staticPodURLHeader")),
    ("address", Text, Field("address")),
    ("port", Int, Field("port")),
    ("read-only-port", Int, Field("readOnlyPort")),
    ("container-runtime-endpoint", Text, Field("containerRuntimeEndpoint")),
    ("image-service-endpoint", Text, Field("imageServiceEndpoint")),
    ("anonymous-auth", Bool, Field("authentication.anonymous.enabled")),
    ("authentication-token-webhook", Bool, Field("authentication.webhook.enabled")),
    ("authentication-token-webhook-cache-ttl", Text, Field("authentication.webhook.cacheTTL")),
    ("client-ca-file", Text, Field("authentication.x509.clientCAFile")),
    ("authorization-mode", Text, Field("authorization.mode")),
    ("authorization-webhook-cache-authorized-ttl", Text, Field("authorization.webhook.cacheAuthorizedTTL")),
    ("authorization-webhook-cache-unauthorized-ttl", Text, Field("authorization.webhook.cacheUnauthorizedTTL")),
    ("tls-cert-file", Text, Field("tlsCertFile")),
    ("tls-private-key-file", Text, Field("tlsPrivateKeyFile")),
    ("rotate-server-certificates", Bool, Field("serverTLSBootstrap")),
    ("tls-cipher-suites", List, Field("tlsCipherSuites")),
    ("tls-min-version", Text, Field("tlsMinVersion")),
    ("rotate-certificates", Bool, Field("rotateCertificates")),
    ("registry-qps", Int, Field("registryPullQPS")),
    ("registry-burst", Int, Field("registryBurst")),
    ("event-qps", Int, Field("eventRecordQPS")),
    ("event-burst", Int, Field("eventBurst")),
    ("enable-debugging-handlers", Bool, Field("enableDebuggingHandlers")),
    ("contention-profiling", Bool, Field("enableContentionProfiling")),
    ("healthz-port", Int, Field("healthzPort")),
    ("healthz-bind-address", Text, Field("healthzBindAddress")),
    ("oom-score-adj", Int, Field("oomScoreAdj")),
    ("cluster-domain", Text, Field("clusterDomain")),
    ("volume-plugin-dir", Text, Field("volumePluginDir")),
    ("cluster-dns", List, Field("clusterDNS")),
    ("streaming-connection-idle-timeout", Text, Field("streamingConnectionIdleTimeout")),
    ("node-status-update-frequency", Text, Field("nodeStatusUpdateFrequency")),
    ("minimum-image-ttl-duration", Text, Field("imageMinimumGCAge")),
    ("image-gc-high-threshold", Int, Field("imageGCHighThresholdPercent")),
    ("image-gc-low-threshold", Int, Field("imageGCLowThresholdPercent")),
    ("volume-stats-agg-period", Text, Field("volumeStatsAggPeriod")),
    ("feature-gates", BoolMap, Field("featureGates")),
    ("kubelet-cgroups", Text, Field("kubeletCgroups")),
    ("system-cgroups", Text, Field("systemCgroups")),
    ("provider-id", Text, Field("providerID")),
    ("cgroups-per-qos", Bool, Field("cgroupsPerQOS")),
    ("cgroup-driver", Text, Field("cgroupDriver")),
    ("cgroup-root", Text, Field("cgroupRoot")),
    ("cpu-manager-policy", Text, Field("cpuManagerPolicy")),
    ("cpu-manager-policy-options", Pairs, Field("cpuManagerPolicyOptions")),
    ("cpu-manager-reconcile-period", Text, Field("cpuManagerReconcilePeriod")),
    ("qos-reserved", Pairs, Field("qosReserved")),
    ("topology-manager-policy", Text, Field("topologyManagerPolicy")),
    ("runtime-request-timeout", Text, Field("runtimeRequestTimeout")),
    ("hairpin-mode", Text, Field("hairpinMode")),
    ("max-pods", Int, Field("maxPods")),
    ("pod-cidr", Text, Field("podCIDR")),
    ("pod-max-pids", Int, Field("podPidsLimit")),
    ("resolv-conf", Text, Field("resolvConf")),
    ("runonce", Bool, Field("runOnce")),
    ("cpu-cfs-quota", Bool, Field("cpuCFSQuota")),
    ("cpu-cfs-quota-period", Text, Field("cpuCFSQuotaPeriod")),
    ("enable-controller-attach-detach", Bool, Field("enableControllerAttachDetach")),
    ("make-iptables-util-chains", Bool, Field("makeIPTablesUtilChains")),
    ("iptables-masquerade-bit", Int, Deprecated(NO_EFFECT)),
    ("iptables-drop-bit", Int, Deprecated(NO_EFFECT)),
    ("container-log-max-size", Text, Field("containerLogMaxSize")),
    ("container-log-max-files", Int, Field("containerLogMaxFiles")),
    ("allowed-unsafe-sysctls", List, Field("allowedUnsafeSysctls")),
    ("node-status-max-images", Int, Field("nodeStatusMaxImages")),
    ("kernel-memcg-notification", Bool, Field("kernelMemcgNotification")),
    ("local-storage-capacity-isolation", Bool, Field("localStorageCapacityIsolation")),
    ("max-open-files", Int, Field("maxOpenFiles")),
    ("kube-api-content-type", Text, Field("contentType")),
    ("kube-api-qps", Int, Field("kubeAPIQPS")),
    ("kube-api-burst", Int, Field("kubeAPIBurst")),
    ("serialize-image-pulls", Bool, Field("serializeImagePulls")),
    ("eviction-hard", LangleMap, Field("evictionHard")),
    ("eviction-soft", LangleMap, Field("evictionSoft")),
    ("eviction-soft-grace-period", Pairs, Field("evictionSoftGracePeriod")),
    ("eviction-pressure-transition-period", Text, Field("evictionPressureTransitionPeriod")),
    ("eviction-max-pod-grace-period", Int, Field("evictionMaxPodGracePeriod")),
    ("eviction-minimum-reclaim", Pairs, Field("evictionMinimumReclaim")),
    ("pods-per-core", Int, Field("podsPerCore")),
    ("protect-kernel-defaults", Bool, Field("protectKernelDefaults")),
    ("reserved-cpus", Text, Field("reservedSystemCPUs")),
    ("topology-manager-scope", Text, Field("topologyManagerScope")),
    ("topology-manager-policy-options", Pairs, Field("topologyManagerPolicyOptions")),
    ("system-reserved", Pairs, Field("systemReserved")),
    ("kube-reserved", Pairs, Field("kubeReserved")),
    ("enforce-node-allocatable", List, Field("enforceNodeAllocatable")),
    ("system-reserved-cgroup", Text, Field("systemReservedCgroup")),
    ("kube-reserved-cgroup", Text, Field("kubeReservedCgroup")),
    ("memory-manager-policy", Text, Field("memoryManagerPolicy")),
    ("reserved-memory", List, Field("reservedMemory")),
    ("register-node", Bool, Field("registerNode")),
    ("register-with-taints", Taints, Field("registerWithTaints")),
    // The logging flags beside `--v` and `--logging-format`.
    ("vmodule", Text, Missing),
    ("log-flush-frequency", Text, Missing),
    ("log-json-split-stream", Bool, Missing),
    ("log-json-info-buffer-size", Text, Missing),
    ("log-text-split-stream", Bool, Missing),
    ("log-text-info-buffer-size", Text, Missing),
];

/// `--help`'s heading for the flags that set a configuration field this agent honours.
const CONFIGURATION: &str = "Configuration (each flag sets the configuration file's field, over the file)";
/// `--help`'s heading for the flags accepted only at upstream's default.
const DEFAULT_ONLY: &str = "Accepted only at upstream's default";
/// `--help`'s heading for the flags accepted without effect.
const WITHOUT_EFFECT: &str = "Accepted without effect in kubelet-rs (named in the start-up warning)";
/// `--help`'s heading for the flags upstream deprecated and ignores.
const DEPRECATED: &str = "Deprecated upstream (ignored, with upstream's deprecation line)";

/// Adds every flag of [`FLAGS`] to `command`, as pflag parses them: a boolean alone or with
/// `=value`, repeatable lists and maps; `--help` shows them under a heading by what they do here.
pub(crate) fn register(mut command: Command) -> Command {
    for &(name, kind, effect) in FLAGS {
        let mut arg = Arg::new(name).long(name).value_name(value_name(kind)).action(ArgAction::Append);
        if kind == Bool {
            arg = arg.num_args(0..=1).require_equals(true).default_missing_value("true");
        }
        arg = match effect {
            Field(field) => match config::configuration::support(field) {
                Some(Support::WithoutEffect) => arg
                    .help(format!("Sets {field}, which has no effect in kubelet-rs (named in the start-up warning)"))
                    .help_heading(WITHOUT_EFFECT),
                Some(Support::DefaultOnly) => arg
                    .help(format!("Sets {field}; only upstream's default is accepted, any other value is an error"))
                    .help_heading(DEFAULT_ONLY),
                _ => {
                    let sentence = config::configuration::describe(field).unwrap_or("Sets the field, over the file.");
                    arg.help(format!("{sentence} [file: {field}]")).help_heading(CONFIGURATION)
                }
            },
            Missing => arg
                .help("A feature kubelet-rs does not have: accepted, and named in the start-up warning")
                .help_heading(WITHOUT_EFFECT),
            Deprecated(message) => arg.help(format!("DEPRECATED: {message}")).help_heading(DEPRECATED),
        };
        command = command.arg(arg);
    }
    command
}

fn value_name(kind: Kind) -> &'static str {
    match kind {
        Bool => "BOOL",
        Int => "N",
        Text => "VALUE",
        List => "A,B",
        Pairs | BoolMap => "KEY=VALUE,...",
        LangleMap => "SIGNAL<QUANTITY,...",
        Headers => "NAME:VALUE,...",
        Taints => "KEY=VALUE:EFFECT,...",
    }
}

/// What the command line said through [`FLAGS`].
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Given {
    /// Configuration fields set by flags, over the file's.
    pub(crate) fields: Map<String, Value>,
    /// The flag behind each field in `fields`.
    pub(crate) flag_of: Vec<(String, String)>,
    /// Flags without effect here (`--lock-file`), for the start-up warning.
    pub(crate) missing: Vec<String>,
    /// Upstream's deprecation lines for the deprecated flags given.
    pub(crate) deprecations: Vec<String>,
}

/// Reads the flags of [`FLAGS`] given on the command line.
pub(crate) fn given(matches: &ArgMatches) -> Result<Given, String> {
    let mut given = Given::default();
    for &(name, kind, effect) in FLAGS {
        if matches.value_source(name) != Some(ValueSource::CommandLine) {
            continue;
        }
        let values: Vec<&str> = matches.get_many::<String>(name).into_iter().flatten().map(String::as_str).collect();
        match effect {
            Field(field) => {
                let value = parse(kind, &values).map_err(|e| format!("invalid argument for --{name}: {e}"))?;
                merge(&mut given.fields, field, value);
                given.flag_of.push((top_level(field).to_owned(), format!("--{name}")));
            }
            Missing => given.missing.push(format!("--{name}")),
            Deprecated(message) => given.deprecations.push(format!("Flag --{name} has been deprecated, {message}")),
        }
    }
    Ok(given)
}

/// Sets `field` (a top-level field, or a dotted path into one: `authentication.x509.clientCAFile`)
/// to `value`; list flags given twice extend the list, and the flags of one object field
/// (`--anonymous-auth` and `--client-ca-file` both set `authentication`) leave a key each.
fn merge(fields: &mut Map<String, Value>, field: &str, value: Value) {
    let (parents, leaf) = match field.rsplit_once('.') {
        Some((parents, leaf)) => (parents.split('.').collect::<Vec<_>>(), leaf),
        None => (Vec::new(), field),
    };
    let mut object = fields;
    for parent in parents {
        let slot = object.entry(parent.to_owned()).or_insert_with(|| Value::Object(Map::new()));
        if !slot.is_object() {
            *slot = Value::Object(Map::new());
        }
        let Value::Object(inner) = slot else { return };
        object = inner;
    }
    match object.get_mut(leaf) {
        Some(Value::Array(old)) if value.is_array() => old.extend(value.as_array().into_iter().flatten().cloned()),
        Some(Value::Object(old)) if value.is_object() => {
            old.extend(value.as_object().into_iter().flatten().map(|(k, v)| (k.clone(), v.clone())));
        }
        _ => _ = object.insert(leaf.to_owned(), value),
    }
}

/// The top-level configuration field a flag's (possibly dotted) field is in.
fn top_level(field: &str) -> &str {
    field.split('.').next().unwrap_or(field)
}

/// The configuration value of a flag given `values` (once per occurrence).
fn parse(kind: Kind, values: &[&str]) -> Result<Value, String> {
    let last = values.last().copied().unwrap_or_default();
    let items = || values.iter().flat_map(|v| v.split(',')).map(str::trim).filter(|s| !s.is_empty());
    let pairs = |separator: char| -> Result<Map<String, Value>, String> {
        items()
            .map(|item| {
                let (key, value) =
                    item.split_once(separator).ok_or_else(|| format!("{item:?} is not key{separator}value"))?;
                Ok((key.trim().to_owned(), Value::String(value.trim().to_owned())))
            })
            .collect()
    };
    Ok(match kind {
        Bool => Value::Bool(last.parse().map_err(|_| format!("{last:?} is not true or false"))?),
        Int => Value::from(last.parse::<i64>().map_err(|_| format!("{last:?} is not a whole number"))?),
        Text => Value::String(last.to_owned()),
        List => Value::Array(items().map(|s| Value::String(s.to_owned())).collect()),
        Pairs => Value::Object(pairs('=')?),
        LangleMap => Value::Object(pairs('<')?),
        BoolMap => {
            let mut map = Map::new();
            for (key, value) in pairs('=')? {
                let text = value.as_str().unwrap_or_default();
                let on = text.parse::<bool>().map_err(|_| format!("{key}: {text:?} is not true or false"))?;
                map.insert(key, Value::Bool(on));
            }
            Value::Object(map)
        }
        Taints => {
            let taints = kubelet_cluster::parse_taints(&values.join(",")).map_err(|e| e.to_string())?;
            serde_json::to_value(taints).map_err(|e| e.to_string())?
        }
        Headers => {
            // Names may repeat: each value is kept, in order.
            let mut map: std::collections::BTreeMap<String, Vec<Value>> = std::collections::BTreeMap::new();
            for item in items() {
                let (name, value) = item.split_once(':').ok_or_else(|| format!("{item:?} is not name:value"))?;
                map.entry(name.trim().to_owned()).or_default().push(Value::String(value.trim().to_owned()));
            }
            Value::Object(map.into_iter().map(|(name, values)| (name, Value::Array(values))).collect())
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_of_an_honoured_field_has_a_sentence_for_help() {
        let undescribed: Vec<&str> = FLAGS
            .iter()
            .filter_map(|(name, _, effect)| match effect {
                Field(field) => Some((*name, *field)),
                _ => None,
            })
            .filter(|(_, field)| {
                let top = field.split('.').next().unwrap_or(field);
                config::configuration::support(top) == Some(Support::Honoured)
            })
            .filter(|(_, field)| config::configuration::describe(field).is_none())
            .map(|(name, _)| name)
            .collect();
        assert!(undescribed.is_empty(), "flags without a sentence: {undescribed:?}");
    }

    fn parse_args(argv: &[&str]) -> Result<Given, String> {
        let command = register(Command::new("kubelet-rs").no_binary_name(true));
        let matches = command.try_get_matches_from(argv).map_err(|e| e.to_string())?;
        given(&matches)
    }

    #[test]
    fn every_flag_is_named_once_and_every_field_is_upstreams() {
        let mut names: Vec<&str> = FLAGS.iter().map(|(name, _, _)| *name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), FLAGS.len());
        for (name, _, effect) in FLAGS {
            if let Field(field) = effect {
                assert!(
                    config::configuration::support(top_level(field)).is_some(),
                    "--{name}: {field} is not upstream's"
                );
            }
        }
    }

    /// Upstream flags declared outside `options.go`, and this agent's own, with where each is from.
    const DECLARED_ELSEWHERE: &[&str] = &[
        // pkg/kubelet/config/flags.go, ContainerRuntimeOptions.AddFlags.
        "runtime-cgroups",
        "pod-infra-container-image",
        "image-credential-provider-config",
        "image-credential-provider-bin-dir",
        // k8s.io/component-base/logs/api/v1, AddFlags (called from AddKubeletConfigFlags).
        "v",
        "vmodule",
        "log-flush-frequency",
        "logging-format",
        "log-json-split-stream",
        "log-json-info-buffer-size",
        "log-text-split-stream",
        "log-text-info-buffer-size",
        // kubelet-rs's own: where pod and container log links go.
        "pod-logs-dir",
        "container-logs-dir",
    ];

    #[test]
    fn every_flag_of_upstreams_options_is_declared_and_nothing_else_is_unexplained() {
        let fixture = include_str!("../tests/fixtures/upstream-kubelet-flags.txt");
        let upstream: Vec<&str> = fixture.lines().filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
        let command = register(<crate::settings::RunArgs as clap::Args>::augment_args(Command::new("run")));
        let ours: Vec<String> = command.get_arguments().filter_map(|arg| arg.get_long()).map(str::to_owned).collect();
        let missing: Vec<&&str> = upstream.iter().filter(|f| !ours.iter().any(|o| o == *f)).collect();
        let unexplained: Vec<&String> = ours
            .iter()
            .filter(|o| !upstream.contains(&o.as_str()) && !DECLARED_ELSEWHERE.contains(&o.as_str()))
            .collect();
        assert!(missing.is_empty(), "upstream's flags this agent does not declare: {missing:?}");
        assert!(
            unexplained.is_empty(),
            "flags neither upstream's options.go nor listed as from elsewhere: {unexplained:?}"
        );
        let undeclared: Vec<&&str> = DECLARED_ELSEWHERE.iter().filter(|f| !ours.iter().any(|o| o == *f)).collect();
        assert!(undeclared.is_empty(), "listed but not declared: {undeclared:?}");
    }

    #[test]
    fn flags_become_configuration_fields_as_pflag_reads_them() {
        let given = parse_args(&[
            "--max-pods=20",
            "--fail-swap-on=false",
            "--cgroups-per-qos",
            "--cluster-dns",
            "10.96.0.10,10.96.0.11",
            "--eviction-hard",
            "memory.available<100Mi",
            "--feature-gates",
            "A=true,B=false",
            "--manifest-url-header",
            "a:x,b:y",
            "--manifest-url-header",
            "a:z",
            "--anonymous-auth=false",
            "--client-ca-file",
            "/ca.crt",
            "--register-with-taints",
            "dedicated=infra:NoSchedule,gpu:NoExecute",
            "--pod-infra-container-image",
            "registry.k8s.io/pause:3.10",
        ])
        .unwrap();
        let fields = Value::Object(given.fields);
        assert_eq!(fields["maxPods"], 20);
        assert_eq!(fields["failSwapOn"], false);
        assert_eq!(fields["cgroupsPerQOS"], true);
        assert_eq!(fields["clusterDNS"], serde_json::json!(["10.96.0.10", "10.96.0.11"]));
        assert_eq!(fields["evictionHard"]["memory.available"], "100Mi");
        assert_eq!(fields["featureGates"], serde_json::json!({"A": true, "B": false}));
        assert_eq!(fields["staticPodURLHeader"], serde_json::json!({"a": ["x", "z"], "b": ["y"]}));
        assert_eq!(
            fields["authentication"],
            serde_json::json!({"anonymous": {"enabled": false}, "x509": {"clientCAFile": "/ca.crt"}}),
            "two flags of one object field"
        );
        assert!(given.missing.is_empty());
        assert_eq!(
            fields["registerWithTaints"],
            serde_json::json!([{"key": "dedicated", "value": "infra", "effect": "NoSchedule"}, {"key": "gpu", "effect": "NoExecute"}])
        );
        assert_eq!(
            given.deprecations,
            [
                "Flag --pod-infra-container-image has been deprecated, will be removed in 1.35. Image garbage collector will get sandbox image information from CRI."
            ]
        );
        assert!(given.flag_of.contains(&("maxPods".to_owned(), "--max-pods".to_owned())));
    }

    #[test]
    fn bad_values_and_misspelt_flags_are_errors() {
        let e = parse_args(&["--max-pods=many"]).unwrap_err();
        assert_eq!(e, "invalid argument for --max-pods: \"many\" is not a whole number");
        let e = parse_args(&["--max-pod=3"]).unwrap_err();
        assert!(e.contains("--max-pods"), "clap suggests the closest flag: {e}");
    }
}
