//! "A cluster's pods run here": every pod template of the rendered manifests of real projects
//! in `../shared/corpus` (kube-prometheus, argo-cd, flux, cert-manager, cloudnative-pg, ...),
//! made into the pod the API server would bind to a node, is checked against the fields this
//! agent refuses, as a node in cluster mode on the real runtime refuses them (a prober, hooks,
//! runtime classes, and the volumes of the API-backed volume manager).
//!
//! Only what the persistent-volume and device issues will take may be refused; the test names
//! every template refused and why, and prints the share that runs.

// Reason: tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use k8s_openapi::api::core::v1::{Pod, Service, Volume};
use kubelet::unsupported::{Abilities, unsupported_fields};
use kubelet_core::{
    PodUid,
    hook::BoxFuture,
    volume::{ObjectData, ObjectSource, VolumeManager as _},
};
use serde_json::{Value, json};

/// The kinds whose objects hold a pod template, and where.
const WORKLOADS: [(&str, &[&str]); 7] = [
    ("Pod", &[]),
    ("Deployment", &["spec", "template"]),
    ("ReplicaSet", &["spec", "template"]),
    ("StatefulSet", &["spec", "template"]),
    ("DaemonSet", &["spec", "template"]),
    ("Job", &["spec", "template"]),
    ("CronJob", &["spec", "jobTemplate", "spec", "template"]),
];

/// What may still be refused: the persistent-volume issue's volumes and the device issue's
/// claims and raw block devices.
fn left_to_later_issues(field: &str) -> bool {
    let later_volumes = [".persistentVolumeClaim", ".csi", ".ephemeral"];
    (field.starts_with("spec.volumes[") && later_volumes.iter().any(|kind| field.ends_with(kind)))
        || field.ends_with(".volumeDevices")
        || field == "spec.resourceClaims"
        || field.ends_with(".resources.claims")
}

/// The corpus, beside the repository's own directory as CI lays it out.
fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus")
}

/// An object source that answers nothing: only the volume manager's `supports` is asked here.
struct NoObjects;

impl ObjectSource for NoObjects {
    fn config_map<'a>(&'a self, _: &'a Pod, _: &'a str) -> BoxFuture<'a, Result<Option<ObjectData>, String>> {
        Box::pin(async { Err("not read here".to_owned()) })
    }

    fn config_map_text<'a>(
        &'a self,
        _: &'a Pod,
        _: &'a str,
    ) -> BoxFuture<'a, Result<Option<BTreeMap<String, String>>, String>> {
        Box::pin(async { Err("not read here".to_owned()) })
    }

    fn secret<'a>(&'a self, _: &'a Pod, _: &'a str) -> BoxFuture<'a, Result<Option<ObjectData>, String>> {
        Box::pin(async { Err("not read here".to_owned()) })
    }

    fn service_account_token<'a>(
        &'a self,
        _: &'a Pod,
        _: Option<&'a str>,
        _: i64,
    ) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async { Err("not read here".to_owned()) })
    }

    fn services<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Option<Vec<Service>>, String>> {
        Box::pin(async { Err("not read here".to_owned()) })
    }

    fn release(&self, _: &PodUid) {}
}

/// Whether `line` is a document's own `kind: <workload>` line (not an indented one of a schema).
fn is_workload_kind_line(line: &str) -> bool {
    WORKLOADS.iter().any(|(kind, _)| line.trim_end() == format!("kind: {kind}"))
}

/// The YAML documents of `text`, each decoded on its own (a manifest of CRDs is large; its
/// documents are not). A document that cannot be decoded is left out unless it is a workload's.
fn documents(text: &str) -> Vec<Value> {
    let mut documents = Vec::new();
    let mut current = String::new();
    for line in text.lines().chain(std::iter::once("---")) {
        if line.trim_end() != "---" {
            current.push_str(line);
            current.push('\n');
            continue;
        }
        if !current.trim().is_empty() {
            match serde_saphyr::from_str::<Value>(&current) {
                Ok(document) => documents.push(document),
                Err(err) => {
                    let workload = current.lines().any(is_workload_kind_line);
                    assert!(!workload, "a workload that cannot be decoded: {err}\n{current}");
                }
            }
        }
        current.clear();
    }
    documents
}

/// The pod the API server would hand a node for `object`'s template, if `object` is a workload:
/// the template's metadata and spec, a StatefulSet's claim templates as the claims of its first
/// pod, and the service account token volume the API server's admission adds.
fn pod_of(object: &Value) -> Option<(String, Pod)> {
    let kind = object["kind"].as_str()?;
    let (_, path) = WORKLOADS.iter().find(|(workload, _)| *workload == kind)?;
    let template = path.iter().fold(object, |value, key| &value[*key]);
    let mut spec = template["spec"].clone();
    spec["containers"].as_array()?;
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let volumes = spec["volumes"].as_array().cloned().unwrap_or_default();
    let mut volumes = volumes;
    for claim in object["spec"]["volumeClaimTemplates"].as_array().into_iter().flatten() {
        let claim_name = claim["metadata"]["name"].as_str().unwrap_or_default();
        volumes.push(
            json!({"name": claim_name, "persistentVolumeClaim": {"claimName": format!("{claim_name}-{name}-0")}}),
        );
    }
    if spec["automountServiceAccountToken"] != json!(false) {
        volumes.push(json!({"name": "kube-api-access-abcde", "projected": {"sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        ]}}));
    }
    spec["volumes"] = Value::Array(volumes);
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": template["metadata"].clone(), "spec": spec});
    let pod: Pod = serde_json::from_value(pod).unwrap_or_else(|e| panic!("{kind} {name}: {e}"));
    Some((format!("{kind} {name}"), pod))
}

#[test]
fn every_pod_template_of_the_corpus_runs_but_for_persistent_volumes_and_devices() {
    let test = "every_pod_template_of_the_corpus_runs_but_for_persistent_volumes_and_devices";
    let dir = corpus_dir();
    if !dir.join("SOURCES.tsv").is_file() {
        assert!(
            !kubelet_core::testing::in_ci(),
            "no corpus at {}: CI has ../shared beside the repository",
            dir.display()
        );
        kubelet_core::testing::not_checked(test, "the corpus", &format!("no corpus at {}", dir.display()));
        return;
    }
    let volumes = volumes::Manager::new("/nonexistent").objects(Arc::new(NoObjects));
    let supports = |volume: &Volume| volumes.supports(volume);
    let abilities = Abilities::new(true, true).runtime_classes(true).volumes(&supports);

    let mut files: Vec<PathBuf> = Vec::new();
    let mut to_visit = vec![dir.clone()];
    while let Some(next) = to_visit.pop() {
        for entry in std::fs::read_dir(&next).unwrap().map(Result::unwrap) {
            let path = entry.path();
            if path.is_dir() {
                to_visit.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                files.push(path);
            }
        }
    }
    files.sort();
    let (mut templates, mut run, mut workloads_in_text) = (0, 0, 0);
    let mut wrongly_refused = Vec::new();
    let mut left = BTreeMap::<String, Vec<String>>::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        workloads_in_text += text.lines().filter(|line| is_workload_kind_line(line)).count();
        let project = file.strip_prefix(&dir).unwrap().components().next().unwrap().as_os_str().to_string_lossy();
        for (what, pod) in documents(&text).iter().filter_map(pod_of) {
            templates += 1;
            let refused = unsupported_fields(&pod, abilities);
            if refused.is_empty() {
                run += 1;
                continue;
            }
            let (later, wrong): (Vec<String>, Vec<String>) =
                refused.into_iter().partition(|field| left_to_later_issues(field));
            if !wrong.is_empty() {
                wrongly_refused.push(format!("{project}: {what}: {}", wrong.join(", ")));
            }
            left.entry(format!("{project}: {what}")).or_default().extend(later);
        }
    }
    eprintln!("corpus: {run} of {templates} pod templates run ({} files)", files.len());
    for (what, fields) in &left {
        eprintln!("corpus: left to the persistent-volume and device issues: {what}: {}", fields.join(", "));
    }
    assert!(templates > 0, "the corpus holds pod templates");
    assert_eq!(templates, workloads_in_text, "every workload of the files is checked, none skipped");
    assert!(wrongly_refused.is_empty(), "refused, though upstream runs them:\n{}", wrongly_refused.join("\n"));
}
