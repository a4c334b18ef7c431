//! Merger tests: every op transition, the emission order, duplicates, and a property test that
//! the merged view always equals each source's last snapshot.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{Container, PodSpec, PodStatus},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
};
use proptest::{prelude::*, test_runner::RngSeed};

use super::*;
use kubelet_core::events::RingRecorder;

fn pod(uid: &str, name: &str, image: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            uid: Some(uid.into()),
            name: Some(name.into()),
            namespace: Some("default".into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container { name: "c".into(), image: Some(image.into()), ..Container::default() }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

fn p(uid: &str) -> Pod {
    pod(uid, &format!("pod-{uid}"), "busybox:1")
}

fn now() -> Timestamp {
    Timestamp::from_second(1_700_000_000).unwrap()
}

/// Updates as (op, UIDs).
type Summary = Vec<(Operation, Vec<String>)>;

fn summary(updates: &[PodUpdate]) -> Summary {
    updates.iter().map(|u| (u.op, u.pods.iter().map(|p| PodUid::of(p).to_string()).collect())).collect()
}

fn ops(items: &[(Operation, &[&str])]) -> Summary {
    items.iter().map(|(op, uids)| (*op, uids.iter().map(|u| u.to_string()).collect())).collect()
}

fn merger() -> (Merger, Arc<RingRecorder>) {
    let ring = Arc::new(RingRecorder::default());
    (Merger::new(ring.clone()), ring)
}

fn set(m: &mut Merger, pods: Vec<Pod>) -> Summary {
    summary(&m.merge(Source::File, Operation::Set, pods, now()))
}

#[test]
fn first_snapshot_adds_or_announces_an_empty_source() {
    let (mut m, _) = merger();
    assert!(!m.is_seen(Source::File));
    assert_eq!(set(&mut m, vec![p("a"), p("b")]), ops(&[(Operation::Add, &["a", "b"])]));
    assert!(m.is_seen(Source::File));
    let (mut m, _) = merger();
    assert_eq!(set(&mut m, vec![]), ops(&[(Operation::Add, &[])]), "an empty ADD marks the source seen");
    assert_eq!(set(&mut m, vec![]), ops(&[]), "only the first time");
}

#[test]
fn snapshot_transitions() {
    let mut deleted = p("a");
    deleted.metadata.deletion_timestamp = Some(Time(now()));
    deleted.metadata.deletion_grace_period_seconds = Some(30);
    let mut status_changed = p("a");
    status_changed.status = Some(PodStatus { phase: Some("Running".into()), ..PodStatus::default() });
    let mut labelled = p("a");
    labelled.metadata.labels = Some(BTreeMap::from([("app".into(), "web".into())]));
    let mut annotated = p("a");
    annotated.metadata.annotations = Some(BTreeMap::from([("team".into(), "x".into())]));
    let mut local_only = p("a");
    local_only.metadata.annotations = Some(BTreeMap::from([(annotations::CONFIG_MIRROR.into(), "h".into())]));
    let cases: Vec<(&str, Vec<Pod>, Summary)> = vec![
        ("unchanged", vec![p("a")], ops(&[])),
        ("spec changed", vec![pod("a", "pod-a", "busybox:2")], ops(&[(Operation::Update, &["a"])])),
        ("labels changed", vec![labelled], ops(&[(Operation::Update, &["a"])])),
        ("annotation changed", vec![annotated], ops(&[(Operation::Update, &["a"])])),
        ("local annotation only", vec![local_only], ops(&[])),
        ("status only", vec![status_changed], ops(&[(Operation::Reconcile, &["a"])])),
        ("graceful delete", vec![deleted], ops(&[(Operation::Delete, &["a"])])),
        ("gone", vec![], ops(&[(Operation::Remove, &["a"])])),
        (
            "new UID for the same name",
            vec![pod("a2", "pod-a", "busybox:1")],
            ops(&[(Operation::Remove, &["a"]), (Operation::Add, &["a2"])]),
        ),
    ];
    for (name, snapshot, want) in cases {
        let (mut m, _) = merger();
        set(&mut m, vec![p("a")]);
        assert_eq!(set(&mut m, snapshot), want, "{name}");
    }
}

#[test]
fn emission_order_is_remove_add_update_delete_reconcile() {
    let (mut m, _) = merger();
    set(&mut m, vec![p("a"), p("b"), p("c"), p("d")]);
    let mut c = p("c");
    c.metadata.deletion_timestamp = Some(Time(now()));
    let mut d = p("d");
    d.status = Some(PodStatus { phase: Some("Running".into()), ..PodStatus::default() });
    let got = set(&mut m, vec![d, c, pod("b", "pod-b", "busybox:2"), p("e")]);
    assert_eq!(
        got,
        ops(&[
            (Operation::Remove, &["a"]),
            (Operation::Add, &["e"]),
            (Operation::Update, &["b"]),
            (Operation::Delete, &["c"]),
            (Operation::Reconcile, &["d"]),
        ])
    );
}

#[test]
fn duplicate_full_names_in_one_source_are_dropped_with_an_event() {
    let (mut m, ring) = merger();
    let got = set(&mut m, vec![pod("a", "web", "x"), pod("b", "web", "y"), p("c")]);
    assert_eq!(got, ops(&[(Operation::Add, &["a", "c"])]));
    let events = ring.events();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].reason, "FailedValidation");
    assert_eq!(events[0].object.uid, "b");
    assert!(events[0].message.contains("duplicate pod name \"web\""), "{}", events[0].message);

    // The same snapshot again (a rescan of an unchanged directory) reports nothing new.
    set(&mut m, vec![pod("a", "web", "x"), pod("b", "web", "y"), p("c")]);
    assert_eq!(ring.events().len(), 1, "a duplicate is reported once");
    // Once it is gone and comes back, it is reported again.
    set(&mut m, vec![pod("a", "web", "x"), p("c")]);
    set(&mut m, vec![pod("a", "web", "x"), pod("b", "web", "y"), p("c")]);
    assert_eq!(ring.events().len(), 2);
}

#[test]
fn increments_and_independent_sources() {
    let (mut m, _) = merger();
    let inc = |m: &mut Merger, source, op, pods| summary(&m.merge(source, op, pods, now()));
    assert_eq!(inc(&mut m, Source::Api, Operation::Add, vec![p("a")]), ops(&[(Operation::Add, &["a"])]));
    assert!(!m.is_seen(Source::Api), "only a snapshot marks a source seen");
    assert_eq!(
        inc(&mut m, Source::Api, Operation::Update, vec![pod("a", "pod-a", "v2")]),
        ops(&[(Operation::Update, &["a"])])
    );
    assert_eq!(inc(&mut m, Source::Api, Operation::Add, vec![p("b")]), ops(&[(Operation::Add, &["b"])]));
    assert_eq!(inc(&mut m, Source::Api, Operation::Remove, vec![p("zzz")]), ops(&[]));
    assert_eq!(inc(&mut m, Source::Api, Operation::Remove, vec![p("a")]), ops(&[(Operation::Remove, &["a"])]));
    assert_eq!(inc(&mut m, Source::Http, Operation::Set, vec![p("h")]), ops(&[(Operation::Add, &["h"])]));
    assert_eq!(inc(&mut m, Source::Http, Operation::Set, vec![]), ops(&[(Operation::Remove, &["h"])]));
    assert_eq!(m.pods_of(Source::Api).len(), 1, "other sources are untouched");
}

#[test]
fn kubelet_annotations_are_set_and_kept() {
    let (mut m, _) = merger();
    let added = m.merge(Source::File, Operation::Set, vec![p("a")], now());
    let a = &added[0].pods[0];
    let annotations_of = |pod: &Pod| pod.metadata.annotations.clone().unwrap();
    assert_eq!(annotations_of(a)[annotations::CONFIG_SOURCE], "file");
    let seen = annotations_of(a)[annotations::CONFIG_SEEN].clone();
    assert_eq!(seen, now().to_string());
    let later = Timestamp::from_second(1_800_000_000).unwrap();
    let updated = m.merge(Source::File, Operation::Set, vec![pod("a", "pod-a", "v2")], later);
    assert_eq!(annotations_of(&updated[0].pods[0])[annotations::CONFIG_SEEN], seen, "first-seen time stays");
}

/// A pool of pod variants: uid u in 0..6 has name `n{u % 4}` (so some collide), an image
/// variant, a status variant, and maybe a deletion timestamp.
fn variant(uid: u8, image: u8, status: u8, deleted: bool) -> Pod {
    let mut pod = pod(&format!("u{uid}"), &format!("n{}", uid % 4), &format!("img:{image}"));
    if status > 0 {
        pod.status = Some(PodStatus { phase: Some(format!("P{status}")), ..PodStatus::default() });
    }
    if deleted {
        pod.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(1).unwrap()));
    }
    pod
}

/// A variant's parameters: uid, image, status, deleted.
type Variant = (u8, u8, u8, bool);

fn snapshot() -> impl Strategy<Value = Vec<Variant>> {
    proptest::collection::vec((0u8..6, 0u8..3, 0u8..2, proptest::bool::weighted(0.1)), 0..6)
}

/// The view a consumer of the updates builds.
fn apply(view: &mut BTreeMap<(Source, String), Arc<Pod>>, updates: &[PodUpdate]) {
    for update in updates {
        for pod in &update.pods {
            let key = (update.source, PodUid::of(pod).to_string());
            match update.op {
                Operation::Add => assert!(view.insert(key, pod.clone()).is_none(), "ADD of a pod already known"),
                Operation::Update | Operation::Delete | Operation::Reconcile => {
                    assert!(view.insert(key, pod.clone()).is_some(), "{:?} of an unknown pod", update.op);
                }
                Operation::Remove => assert!(view.remove(&key).is_some(), "REMOVE of an unknown pod"),
                op => panic!("the merger never emits {op:?}"),
            }
        }
    }
}

fn essence(pod: &Pod) -> (Option<String>, Option<PodSpec>, Option<PodStatus>, bool) {
    (pod.metadata.name.clone(), pod.spec.clone(), pod.status.clone(), pod.metadata.deletion_timestamp.is_some())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 2000,
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(kubelet_core::testing::proptest_seed(module_path!())),
        ..ProptestConfig::default()
    })]

    #[test]
    fn merged_view_equals_the_last_snapshot_of_each_source(steps in proptest::collection::vec((any::<bool>(), any::<bool>(), snapshot()), 1..25)) {
        let (mut m, _) = merger();
        let mut view = BTreeMap::new();
        let mut last: BTreeMap<Source, Vec<Pod>> = BTreeMap::new();
        // Shared snapshots give each variant as one `Arc`, kept as a source keeps its pods.
        let mut kept: HashMap<(Source, Variant), Arc<Pod>> = HashMap::new();
        for (http, shared, variants) in steps {
            let source = if http { Source::Http } else { Source::File };
            let pods: Vec<Pod> = variants.iter().map(|&(u, i, s, d)| variant(u, i, s, d)).collect();
            let updates = if shared {
                let given: Vec<Arc<Pod>> = variants
                    .iter()
                    .zip(&pods)
                    .map(|(v, pod)| kept.entry((source, *v)).or_insert_with(|| Arc::new(pod.clone())).clone())
                    .collect();
                m.merge(source, Operation::Set, given, now())
            } else {
                m.merge(source, Operation::Set, pods.clone(), now())
            };
            apply(&mut view, &updates);
            last.insert(source, pods);
        }
        for pod in kept.values() {
            prop_assert!(pod.metadata.annotations.is_none(), "the merger changed a pod its source keeps");
        }
        for (source, pods) in last {
            // What the snapshot means: the first pod of each full name, by UID.
            let mut names = std::collections::HashSet::new();
            let mut want: BTreeMap<String, _> = BTreeMap::new();
            for pod in pods {
                if names.insert(kubelet_core::types::pod_full_name(&pod)) {
                    want.insert(PodUid::of(&pod).to_string(), essence(&pod));
                }
            }
            let merged: BTreeMap<String, _> = m.pods_of(source).iter().map(|p| (PodUid::of(p).to_string(), essence(p))).collect();
            prop_assert_eq!(&merged, &want);
            let seen: BTreeMap<String, _> = view.iter().filter(|((s, _), _)| *s == source).map(|((_, u), p)| (u.clone(), essence(p))).collect();
            prop_assert_eq!(&seen, &want);
        }
    }
}
