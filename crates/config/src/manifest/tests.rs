//! Manifest decoding, defaulting and validation tests.

use std::path::Path;

use proptest::{prelude::*, test_runner::RngSeed};

use kubelet_core::ErrorChain;

use super::*;

const WEB: &str = "\
apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  containers:
  - name: httpd
    image: busybox:1.35
    ports:
    - containerPort: 80
      name: http
    livenessProbe:
      httpGet:
        port: 80
";

fn file(name: &str) -> Origin {
    Origin::File(Path::new("/etc/kubernetes/manifests").join(name))
}

fn one(bytes: &str) -> Pod {
    let mut pods = static_pods(bytes.as_bytes(), &file("web.yaml"), "Node-1", false).unwrap();
    assert_eq!(pods.len(), 1);
    pods.remove(0)
}

fn invalid_field(bytes: &str) -> String {
    match static_pods(bytes.as_bytes(), &file("bad.yaml"), "node-1", false).unwrap_err() {
        ManifestError::Invalid { field, .. } => field,
        other => panic!("expected a validation error, got {other}"),
    }
}

#[test]
fn decodes_yaml_and_json_pods_and_pod_lists() {
    let origin = file("x");
    assert_eq!(decode(WEB.as_bytes(), &origin, false).unwrap().len(), 1);
    let json = r#"{"metadata":{"name":"j"},"spec":{"containers":[{"name":"c","image":"i"}]}}"#;
    assert_eq!(decode(json.as_bytes(), &origin, false).unwrap()[0].metadata.name.as_deref(), Some("j"));
    let list = "kind: PodList\nitems:\n- metadata: {name: a}\n  spec: {containers: [{name: c, image: i}]}\n- metadata: {name: b}\n  spec: {containers: [{name: c, image: i}]}\n";
    assert_eq!(decode(list.as_bytes(), &origin, true).unwrap().len(), 2);
    assert!(matches!(
        decode(list.as_bytes(), &origin, false),
        Err(ManifestError::WrongKind { list_allowed: false, .. })
    ));
    let service = "apiVersion: v1\nkind: Service\nmetadata: {name: s}\n";
    let err = decode(service.as_bytes(), &origin, true).unwrap_err();
    assert_eq!(err.to_string(), format!("{origin}: expected kind Pod or PodList, got \"Service\""));
}

#[test]
fn a_leading_zero_is_octal_as_upstreams_yaml_reads_it() {
    let pod = one("metadata: {name: web}\nspec:\n  containers: [{name: c, image: i}]\n  \
         volumes: [{name: v, downwardAPI: {defaultMode: 0400, items: [{path: p, mode: 0644, fieldRef: {fieldPath: metadata.name}}]}}]\n");
    let downward = pod.spec.unwrap().volumes.unwrap()[0].downward_api.clone().unwrap();
    assert_eq!(downward.default_mode, Some(0o400));
    assert_eq!(downward.items.unwrap()[0].mode, Some(0o644));
}

#[test]
fn decode_errors_name_the_origin_and_the_line() {
    let bad = "metadata:\n  name: web\nspec:\n  containers:\n  - name: c\n    image: i\n    ports:\n    - containerPort: eighty\n";
    let err = decode(bad.as_bytes(), &file("web.yaml"), false).unwrap_err();
    let message = ErrorChain(&err).to_string();
    assert!(message.starts_with("/etc/kubernetes/manifests/web.yaml: cannot decode: invalid YAML: "), "{message}");
    assert!(message.contains("line 8"), "{message}");
    for bytes in [&b""[..], b"   \n", b"\xff\xfe", b"- just\n- a list\n", b"{\"metadata\": "] {
        assert!(matches!(decode(bytes, &file("x"), false), Err(ManifestError::Decode { .. })), "{bytes:?}");
    }
    let multi = "metadata: {name: a}\n---\nmetadata: {name: b}\n";
    assert!(
        matches!(decode(multi.as_bytes(), &file("x"), false), Err(ManifestError::Decode { .. })),
        "one pod per file"
    );
}

#[test]
fn rejects_manifests_over_ten_megabytes() {
    let big = vec![b' '; MAX_MANIFEST_BYTES + 1];
    assert!(
        matches!(decode(&big, &file("big"), false), Err(ManifestError::TooLarge { size, .. }) if size == MAX_MANIFEST_BYTES + 1)
    );
}

/// Nine anchors, each nine aliases of the one before: 9^10 nodes from 500 bytes.
fn billion_laughs() -> String {
    let mut yaml = String::from("a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n");
    for (name, before) in ('b'..='j').zip('a'..='i') {
        let aliases = vec![format!("*{before}"); 9].join(",");
        yaml.push_str(&format!("{name}: &{name} [{aliases}]\n"));
    }
    yaml
}

#[test]
fn aliases_expand_to_a_few_nodes_per_byte_at_most() {
    assert_eq!(yaml_node_budget(500, 250_000), 12_000);
    assert_eq!(yaml_node_budget(10 << 20, 250_000), 250_000, "never past serde-saphyr's own ceiling");
    let laughs = billion_laughs();
    let Err(ManifestError::Decode { source: Some(source), .. }) = decode(laughs.as_bytes(), &file("laughs"), false)
    else {
        panic!("billion laughs decoded")
    };
    let message = source.to_string();
    let nodes = message.split("Nodes { nodes: ").nth(1).and_then(|rest| rest.split(' ').next());
    let nodes: usize = nodes.and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("no node budget: {message}"));
    assert!(nodes <= yaml_node_budget(laughs.len(), 250_000) + 1, "stopped at {nodes} nodes: {message}");
    // A manifest that uses anchors as people do still decodes.
    let anchored = format!(
        "{WEB}    env: &env\n    - {{name: A, value: a}}\n    - {{name: B, value: b}}\n  initContainers:\n  \
         - name: init\n    image: busybox:1.35\n    env: *env\n"
    );
    let pods = decode(anchored.as_bytes(), &file("anchored"), false).unwrap();
    let init = &pods[0].spec.as_ref().unwrap().init_containers.as_ref().unwrap()[0];
    assert_eq!(init.env.as_ref().unwrap().len(), 2);
}

#[test]
fn default_pull_policy_follows_the_tag() {
    for (image, want) in [
        ("busybox", "Always"),
        ("busybox:latest", "Always"),
        ("busybox:1.35", "IfNotPresent"),
        ("127.0.0.1:5000/lab/busybox", "Always"),
        ("127.0.0.1:5000/lab/busybox:1.35", "IfNotPresent"),
        ("busybox@sha256:9d75a553", "IfNotPresent"),
    ] {
        assert_eq!(default_pull_policy(image), want, "{image}");
    }
}

#[test]
fn api_defaults_fill_what_the_kubelet_relies_on() {
    let pod = one(WEB);
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
    assert_eq!(spec.termination_grace_period_seconds, Some(30));
    assert_eq!(spec.dns_policy.as_deref(), Some("ClusterFirst"));
    let c = &spec.containers[0];
    assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));
    assert_eq!(c.termination_message_path.as_deref(), Some("/dev/termination-log"));
    assert_eq!(c.termination_message_policy.as_deref(), Some("File"));
    assert_eq!(c.ports.as_ref().unwrap()[0].protocol.as_deref(), Some("TCP"));
    let probe = c.liveness_probe.as_ref().unwrap();
    assert_eq!(
        (probe.timeout_seconds, probe.period_seconds, probe.success_threshold, probe.failure_threshold),
        (Some(1), Some(10), Some(1), Some(3))
    );
    assert_eq!(probe.http_get.as_ref().unwrap().path.as_deref(), Some("/"));
    // Explicit values stay.
    let pod = one(
        "metadata: {name: w}\nspec:\n  restartPolicy: Never\n  terminationGracePeriodSeconds: 3\n  containers: [{name: c, image: i, imagePullPolicy: Never}]\n",
    );
    let spec = pod.spec.unwrap();
    assert_eq!((spec.restart_policy.as_deref(), spec.termination_grace_period_seconds), (Some("Never"), Some(3)));
    assert_eq!(spec.containers[0].image_pull_policy.as_deref(), Some("Never"));
}

#[test]
fn host_network_ports_default_host_port_and_requests_default_to_limits() {
    let pod = one(
        "metadata: {name: w}\nspec:\n  hostNetwork: true\n  containers:\n  - name: c\n    image: i\n    ports: [{containerPort: 8080}]\n    resources: {limits: {cpu: 500m, memory: 64Mi}, requests: {cpu: 100m}}\n",
    );
    let c = &pod.spec.as_ref().unwrap().containers[0];
    assert_eq!(c.ports.as_ref().unwrap()[0].host_port, Some(8080));
    let requests = c.resources.as_ref().unwrap().requests.as_ref().unwrap();
    assert_eq!(requests["cpu"].0, "100m", "explicit requests stay");
    assert_eq!(requests["memory"].0, "64Mi", "missing requests come from limits");
}

#[test]
fn static_defaults_name_namespace_node_annotations_toleration_phase() {
    let pod = one(WEB);
    assert_eq!(pod.metadata.name.as_deref(), Some("web-node-1"));
    assert_eq!(pod.metadata.namespace.as_deref(), Some("default"));
    let uid = pod.metadata.uid.clone().unwrap();
    assert_eq!(uid.len(), 32);
    assert_eq!(pod.metadata.annotations.as_ref().unwrap()[annotations::CONFIG_HASH], uid);
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.node_name.as_deref(), Some("Node-1"));
    let toleration = &spec.tolerations.as_ref().unwrap()[0];
    assert_eq!((toleration.operator.as_deref(), toleration.effect.as_deref()), (Some("Exists"), Some("NoExecute")));
    assert_eq!(pod.status.unwrap().phase.as_deref(), Some("Pending"));

    // URL pods get no toleration.
    let pods = static_pods(WEB.as_bytes(), &Origin::Url("http://127.0.0.1/pods".into()), "n", true).unwrap();
    assert!(pods[0].spec.as_ref().unwrap().tolerations.is_none());
    // A UID in the manifest is kept.
    let fixed = one("metadata: {name: w, uid: fixed-uid}\nspec: {containers: [{name: c, image: i}]}\n");
    assert_eq!(fixed.metadata.uid.as_deref(), Some("fixed-uid"));
}

#[test]
fn static_uid_is_stable_and_covers_content_node_and_path() {
    let uid = |bytes: &str, origin: &Origin, node: &str| {
        static_pods(bytes.as_bytes(), origin, node, false).unwrap()[0].metadata.uid.clone().unwrap()
    };
    let base = uid(WEB, &file("web.yaml"), "node-1");
    // Pinned: a change here gives every static pod a new UID on upgrade.
    assert_eq!(base, "60994d86e257a1b3279f79a388a32993");
    assert_ne!(base, uid(&WEB.replace("1.35", "1.36"), &file("web.yaml"), "node-1"), "content");
    assert_ne!(base, uid(WEB, &file("web2.yaml"), "node-1"), "path");
    assert_ne!(base, uid(WEB, &file("web.yaml"), "node-2"), "node");
    assert_eq!(
        base,
        uid(&WEB.replace("  name: web\n", "  name: web # comment\n"), &file("web.yaml"), "node-1"),
        "comments do not count"
    );
}

#[test]
fn validation_names_the_field() {
    let cases = [
        ("spec: {containers: [{name: c, image: i}]}\n", "metadata.name"),
        ("metadata: {name: Web}\nspec: {containers: [{name: c, image: i}]}\n", "metadata.name"),
        ("metadata: {name: w, namespace: Bad_NS}\nspec: {containers: [{name: c, image: i}]}\n", "metadata.namespace"),
        ("metadata: {name: w}\n", "spec"),
        ("metadata: {name: w}\nspec: {containers: []}\n", "spec.containers"),
        (
            "metadata: {name: w}\nspec: {containers: [{name: c, image: i}, {name: c, image: i}]}\n",
            "spec.containers[1].name",
        ),
        (
            "metadata: {name: w}\nspec: {initContainers: [{name: c, image: i}], containers: [{name: c, image: i}]}\n",
            "spec.containers[0].name",
        ),
        ("metadata: {name: w}\nspec: {containers: [{name: C, image: i}]}\n", "spec.containers[0].name"),
        ("metadata: {name: w}\nspec: {containers: [{name: c}]}\n", "spec.containers[0].image"),
        (
            "metadata: {name: w}\nspec: {initContainers: [{name: i, image: ' '}], containers: [{name: c, image: i}]}\n",
            "spec.initContainers[0].image",
        ),
        (
            "metadata: {name: w}\nspec: {containers: [{name: c, image: i, ports: [{containerPort: 0}]}]}\n",
            "spec.containers[0].ports[0].containerPort",
        ),
        (
            "metadata: {name: w}\nspec: {containers: [{name: c, image: i, ports: [{containerPort: 70000}]}]}\n",
            "spec.containers[0].ports[0].containerPort",
        ),
        (
            "metadata: {name: w}\nspec: {containers: [{name: c, image: i, ports: [{containerPort: 80, hostPort: 70000}]}]}\n",
            "spec.containers[0].ports[0].hostPort",
        ),
        (
            "metadata: {name: w}\nspec: {containers: [{name: c, image: i, ports: [{containerPort: 80, protocol: ICMP}]}]}\n",
            "spec.containers[0].ports[0].protocol",
        ),
        (
            "metadata: {name: w}\nspec: {containers: [{name: c, image: i, ports: [{containerPort: 80, name: a}, {containerPort: 81, name: a}]}]}\n",
            "spec.containers[0].ports[1].name",
        ),
        (
            "metadata: {name: w}\nspec: {restartPolicy: Sometimes, containers: [{name: c, image: i}]}\n",
            "spec.restartPolicy",
        ),
        ("metadata: {name: w}\nspec: {dnsPolicy: Magic, containers: [{name: c, image: i}]}\n", "spec.dnsPolicy"),
        (
            "metadata: {name: w}\nspec: {terminationGracePeriodSeconds: -1, containers: [{name: c, image: i}]}\n",
            "spec.terminationGracePeriodSeconds",
        ),
        (
            "metadata: {name: w}\nspec: {activeDeadlineSeconds: 0, containers: [{name: c, image: i}]}\n",
            "spec.activeDeadlineSeconds",
        ),
        (
            "metadata: {name: w}\nspec: {containers: [{name: c, image: i, imagePullPolicy: Sometimes}]}\n",
            "spec.containers[0].imagePullPolicy",
        ),
        (
            "metadata: {name: w}\nspec: {containers: [{name: c, image: i, env: [{name: 'A=B', value: x}]}]}\n",
            "spec.containers[0].env[0].name",
        ),
        (
            "metadata: {name: w}\nspec: {containers: [{name: c, image: i, volumeMounts: [{name: data, mountPath: /d}]}]}\n",
            "spec.containers[0].volumeMounts[0].name",
        ),
        (
            "metadata: {name: w}\nspec: {volumes: [{name: d, emptyDir: {}}, {name: d, emptyDir: {}}], containers: [{name: c, image: i}]}\n",
            "spec.volumes[1].name",
        ),
        (
            "metadata: {name: w}\nspec: {containers: [{name: c, image: i, readinessProbe: {periodSeconds: 1}}]}\n",
            "spec.containers[0].readinessProbe",
        ),
        (
            "metadata: {name: w}\nspec: {containers: [{name: c, image: i, livenessProbe: {exec: {command: [x]}, tcpSocket: {port: 1}}}]}\n",
            "spec.containers[0].livenessProbe",
        ),
        (
            "metadata: {name: w}\nspec: {containers: [{name: c, image: i, startupProbe: {exec: {command: [x]}, successThreshold: 2}}]}\n",
            "spec.containers[0].startupProbe.successThreshold",
        ),
        (
            "metadata: {name: w}\nspec: {containers: [{name: c, image: i, readinessProbe: {exec: {command: [x]}, failureThreshold: -1}}]}\n",
            "spec.containers[0].readinessProbe.failureThreshold",
        ),
        (
            "metadata: {name: w}\nspec: {containers: [{name: c, image: i, livenessProbe: {exec: {command: [x]}, terminationGracePeriodSeconds: 0}}]}\n",
            "spec.containers[0].livenessProbe.terminationGracePeriodSeconds",
        ),
        (
            "metadata: {name: w}\nspec: {containers: [{name: c, image: i, lifecycle: {postStart: {}}}]}\n",
            "spec.containers[0].lifecycle.postStart",
        ),
        (
            "metadata: {name: w}\nspec: {containers: [{name: c, image: i, lifecycle: {preStop: {sleep: {seconds: 1}, exec: {command: [x]}}}}]}\n",
            "spec.containers[0].lifecycle.preStop",
        ),
        (
            "metadata: {name: w}\nspec: {containers: [{name: c, image: i, lifecycle: {preStop: {sleep: {seconds: -1}}}}]}\n",
            "spec.containers[0].lifecycle.preStop.sleep.seconds",
        ),
    ];
    for (manifest, field) in cases {
        assert_eq!(invalid_field(manifest), field, "{manifest}");
    }
    let err = static_pods(b"metadata: {name: w}\nspec: {containers: [{name: c}]}\n", &file("bad.yaml"), "n", false)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "/etc/kubernetes/manifests/bad.yaml: invalid pod \"w-n\": spec.containers[0].image: required value"
    );
}

#[test]
fn static_pods_may_not_reference_api_objects() {
    let c = "containers: [{name: c, image: i}]";
    let cases = [
        (format!("serviceAccountName: builder, {c}"), r#"ServiceAccount "builder""#),
        ("containers: [{name: c, image: i, envFrom: [{configMapRef: {name: cm}}]}]".to_owned(), r#"ConfigMap "cm""#),
        (
            "containers: [{name: c, image: i, env: [{name: P, valueFrom: {secretKeyRef: {name: s, key: k}}}]}]"
                .to_owned(),
            r#"Secret "s""#,
        ),
        (format!("volumes: [{{name: v, secret: {{secretName: s}}}}], {c}"), r#"Secret "s", Secret volume "v""#),
        (format!("volumes: [{{name: v, configMap: {{name: cm}}}}], {c}"), r#"ConfigMap "cm", ConfigMap volume "v""#),
        (
            format!("volumes: [{{name: p, persistentVolumeClaim: {{claimName: p}}}}], {c}"),
            r#"PersistentVolumeClaim volume "p""#,
        ),
        (
            format!("volumes: [{{name: t, projected: {{sources: [{{serviceAccountToken: {{path: t}}}}]}}}}], {c}"),
            r#"serviceAccountToken projected volume "t""#,
        ),
        (
            format!("imagePullSecrets: [{{name: reg}}], volumes: [{{name: t}}], {c}"),
            r#"Secret "reg", unknown type for volume "t""#,
        ),
    ];
    for (spec, references) in cases {
        let manifest = format!("metadata: {{name: w}}\nspec: {{{spec}}}\n");
        let err = static_pods(manifest.as_bytes(), &file("bad.yaml"), "n", false).unwrap_err();
        assert!(matches!(err, ManifestError::ApiReferences { .. }), "{manifest}: {err}");
        assert_eq!(
            err.to_string(),
            format!(
                "/etc/kubernetes/manifests/bad.yaml: pod \"w-n\" has forbidden references to API objects: {references}"
            ),
            "{manifest}"
        );
    }
    // Downward-API env, hostPath, emptyDir and projected downward API volumes are fine.
    one(
        "metadata: {name: w}\nspec:\n  volumes: [{name: h, hostPath: {path: /tmp}}, {name: e, emptyDir: {}}, {name: p, projected: {sources: [{downwardAPI: {items: [{path: n, fieldRef: {fieldPath: metadata.name}}]}}]}}]\n  containers: [{name: c, image: i, env: [{name: N, valueFrom: {fieldRef: {fieldPath: metadata.name}}}], volumeMounts: [{name: h, mountPath: /h}]}]\n",
    );
}

fn mutated_manifest() -> impl Strategy<Value = Vec<u8>> {
    let base = WEB.as_bytes().to_vec();
    proptest::collection::vec((0..base.len(), any::<u8>()), 0..8).prop_map(move |edits| {
        let mut bytes = base.clone();
        for (at, byte) in edits {
            bytes[at] = byte;
        }
        bytes
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 100_000,
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(kubelet_core::testing::proptest_seed(module_path!())),
        ..ProptestConfig::default()
    })]

    /// Arbitrary bytes and mutated manifests never panic the decoder: they decode or get an error.
    #[test]
    fn decoder_never_panics(bytes in prop_oneof![proptest::collection::vec(any::<u8>(), 0..256), mutated_manifest()]) {
        let _ = static_pods(&bytes, &Origin::Url("http://127.0.0.1/x".into()), "node", true);
    }
}
