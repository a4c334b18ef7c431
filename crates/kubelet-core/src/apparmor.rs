//! AppArmor as upstream's kubelet takes it (`pkg/security/apparmor`): a container's profile from
//! its own `securityContext.appArmorProfile`, else the deprecated annotation
//! `container.apparmor.security.beta.kubernetes.io/<container>` (a static pod's fields may not
//! have been synced to it), else the pod's; whether a pod needs AppArmor at all; and whether this
//! host enforces it.

use k8s_openapi::api::core::v1::{AppArmorProfile, Pod, SecurityContext};

/// The prefix of the deprecated per-container annotation.
pub const ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";

/// A container's AppArmor profile: the API's three kinds, a closed set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Profile {
    /// The runtime's default profile.
    RuntimeDefault,
    /// A profile loaded on the node, by name.
    Localhost(String),
    /// No AppArmor confinement.
    Unconfined,
}

impl Profile {
    /// The profile as the deprecated annotation and CRI's deprecated `apparmor_profile` name
    /// it: `runtime/default`, `localhost/<name>`, `unconfined`.
    pub fn deprecated_name(&self) -> String {
        match self {
            Profile::RuntimeDefault => "runtime/default".to_owned(),
            Profile::Localhost(name) => format!("localhost/{name}"),
            Profile::Unconfined => "unconfined".to_owned(),
        }
    }

    fn of_field(field: &AppArmorProfile) -> Option<Profile> {
        match field.type_.as_str() {
            "RuntimeDefault" => Some(Profile::RuntimeDefault),
            "Localhost" => Some(Profile::Localhost(field.localhost_profile.clone().unwrap_or_default())),
            "Unconfined" => Some(Profile::Unconfined),
            _ => None,
        }
    }

    fn of_annotation(value: &str) -> Option<Profile> {
        match value {
            "runtime/default" => Some(Profile::RuntimeDefault),
            "unconfined" => Some(Profile::Unconfined),
            _ => value.strip_prefix("localhost/").map(|name| Profile::Localhost(name.to_owned())),
        }
    }
}

/// The profile of container `name` (with its `security_context`) of `pod`, if any is asked
/// for (upstream `GetProfile`): the container's field, the annotation, then the pod's field.
pub fn profile(pod: &Pod, name: &str, security_context: Option<&SecurityContext>) -> Option<Profile> {
    if let Some(field) = security_context.and_then(|sc| sc.app_armor_profile.as_ref()) {
        return Profile::of_field(field);
    }
    let annotation = pod.metadata.annotations.as_ref().and_then(|a| a.get(&format!("{ANNOTATION_PREFIX}{name}")));
    if let Some(annotation) = annotation {
        return Profile::of_annotation(annotation);
    }
    let pod_field =
        pod.spec.as_ref().and_then(|s| s.security_context.as_ref()).and_then(|sc| sc.app_armor_profile.as_ref());
    pod_field.and_then(Profile::of_field)
}

/// Whether `pod` asks for AppArmor confinement anywhere (upstream `isRequired`): a profile
/// other than `Unconfined` in a field, or an annotation other than `unconfined`.
pub fn is_required(pod: &Pod) -> bool {
    let confining = |field: Option<&AppArmorProfile>| field.is_some_and(|f| f.type_ != "Unconfined");
    let spec = pod.spec.as_ref();
    if confining(spec.and_then(|s| s.security_context.as_ref()).and_then(|sc| sc.app_armor_profile.as_ref())) {
        return true;
    }
    let containers = spec.into_iter().flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers));
    let ephemeral = spec.into_iter().flat_map(|s| s.ephemeral_containers.iter().flatten());
    let container_fields = containers
        .map(|c| c.security_context.as_ref())
        .chain(ephemeral.map(|c| c.security_context.as_ref()))
        .map(|sc| sc.and_then(|sc| sc.app_armor_profile.as_ref()));
    if container_fields.into_iter().any(confining) {
        return true;
    }
    let annotations = pod.metadata.annotations.iter().flatten();
    annotations.filter(|(key, _)| key.starts_with(ANNOTATION_PREFIX)).any(|(_, value)| value != "unconfined")
}

/// Why this host cannot enforce AppArmor profiles, in upstream's words, or `None` when it can
/// (runc's `apparmor.IsEnabled`: the securityfs directory and the module's `enabled` parameter).
pub fn host_unavailable() -> Option<&'static str> {
    let enabled = std::path::Path::new("/sys/kernel/security/apparmor").is_dir()
        && std::fs::read_to_string("/sys/module/apparmor/parameters/enabled").is_ok_and(|v| v.starts_with('Y'));
    (!enabled).then_some("AppArmor is not enabled on the host")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::{
        api::core::v1::{Container, PodSecurityContext, PodSpec},
        apimachinery::pkg::apis::meta::v1::ObjectMeta,
    };

    use super::*;

    fn pod(annotations: &[(&str, &str)], pod_field: Option<&str>) -> Pod {
        let field = pod_field.map(|kind| AppArmorProfile { type_: kind.into(), ..AppArmorProfile::default() });
        Pod {
            metadata: ObjectMeta {
                annotations: Some(
                    annotations.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect::<BTreeMap<_, _>>(),
                ),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container { name: "app".into(), ..Container::default() }],
                security_context: Some(PodSecurityContext {
                    app_armor_profile: field,
                    ..PodSecurityContext::default()
                }),
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn the_containers_field_then_the_pods_then_the_annotation() {
        let annotated = pod(&[("container.apparmor.security.beta.kubernetes.io/app", "localhost/k8s-nginx")], None);
        assert_eq!(profile(&annotated, "app", None), Some(Profile::Localhost("k8s-nginx".into())));
        assert_eq!(profile(&annotated, "other", None), None);
        let both = pod(&[("container.apparmor.security.beta.kubernetes.io/app", "unconfined")], Some("RuntimeDefault"));
        assert_eq!(profile(&both, "app", None), Some(Profile::Unconfined), "the annotation over the pod's field");
        assert_eq!(profile(&both, "other", None), Some(Profile::RuntimeDefault), "the pod's, without an annotation");
        let own = SecurityContext {
            app_armor_profile: Some(AppArmorProfile { type_: "Unconfined".into(), ..AppArmorProfile::default() }),
            ..SecurityContext::default()
        };
        let runtime_default = SecurityContext {
            app_armor_profile: Some(AppArmorProfile { type_: "RuntimeDefault".into(), ..AppArmorProfile::default() }),
            ..SecurityContext::default()
        };
        assert_eq!(profile(&both, "app", Some(&own)), Some(Profile::Unconfined), "the container's field first");
        assert_eq!(profile(&both, "app", Some(&runtime_default)), Some(Profile::RuntimeDefault));
        assert_eq!(Profile::Localhost("p".into()).deprecated_name(), "localhost/p");
    }

    #[test]
    fn only_a_confining_profile_requires_apparmor() {
        assert!(!is_required(&pod(&[], None)));
        assert!(!is_required(&pod(&[], Some("Unconfined"))));
        assert!(is_required(&pod(&[], Some("RuntimeDefault"))));
        assert!(!is_required(&pod(&[("container.apparmor.security.beta.kubernetes.io/app", "unconfined")], None)));
        assert!(is_required(&pod(&[("container.apparmor.security.beta.kubernetes.io/app", "runtime/default")], None)));
    }
}
