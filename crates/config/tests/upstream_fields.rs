//! The field table is checked against upstream's own list, kept as a fixture with its source
//! named, so a field upstream adds, renames or removes cannot go unnoticed here.

// Reason: tests fail by panicking.
#![allow(clippy::unwrap_used, missing_docs)]

use kubelet_config::configuration::FIELDS;

#[test]
fn the_field_table_is_upstreams_list_in_upstreams_order() {
    let fixture = include_str!("fixtures/upstream-kubelet-configuration-fields.txt");
    let upstream: Vec<&str> = fixture.lines().filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
    let ours: Vec<&str> = FIELDS.iter().map(|(name, _)| *name).collect();
    let missing: Vec<&&str> = upstream.iter().filter(|f| !ours.contains(f)).collect();
    let extra: Vec<&&str> = ours.iter().filter(|f| !upstream.contains(f)).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "upstream's fields not in FIELDS: {missing:?}; in FIELDS, not upstream's: {extra:?}"
    );
    assert_eq!(ours, upstream, "FIELDS keeps upstream's order");
}
