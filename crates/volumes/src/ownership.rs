//! Who owns a pod's volume files, as upstream's kubelet gives them: the pod's `fsGroup` owns
//! its emptyDir volumes and every file of the volumes the agent writes (upstream's
//! `SetVolumeOwnership`), and a projected service account token goes to the user every
//! container runs as (upstream's `FsUserFrom`).

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::atomic::Group;

/// The pod's `fsGroup`, the group its volumes are given.
pub(crate) fn fs_group(pod: &Pod) -> Group {
    let fs_group = pod.spec.as_ref().and_then(|s| s.security_context.as_ref()).and_then(|s| s.fs_group);
    Group(fs_group.and_then(|gid| u32::try_from(gid).ok()))
}

/// The user every init and regular container runs as, when they all run as one set user (a
/// container's `runAsUser`, else the pod's); `None` when any runs as the image's user or two
/// differ. Ephemeral containers do not count, as upstream's.
pub(crate) fn fs_user(pod: &Pod) -> Option<u32> {
    let spec = pod.spec.as_ref()?;
    let pod_user = spec.security_context.as_ref().and_then(|s| s.run_as_user);
    let user_of = |container: &Container| container.security_context.as_ref().and_then(|s| s.run_as_user).or(pod_user);
    let mut users = spec.init_containers.iter().flatten().chain(&spec.containers).map(user_of);
    let first = users.next()??;
    users.all(|user| user == Some(first)).then_some(first).and_then(|uid| u32::try_from(uid).ok())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodSecurityContext, PodSpec, SecurityContext};

    use super::*;

    fn container(run_as_user: Option<i64>) -> Container {
        let security_context =
            run_as_user.map(|uid| SecurityContext { run_as_user: Some(uid), ..SecurityContext::default() });
        Container { name: "c".into(), security_context, ..Container::default() }
    }

    fn pod(pod_user: Option<i64>, fs_group: Option<i64>, init: Vec<Container>, containers: Vec<Container>) -> Pod {
        let security_context =
            Some(PodSecurityContext { run_as_user: pod_user, fs_group, ..PodSecurityContext::default() });
        let spec = PodSpec { security_context, init_containers: Some(init), containers, ..PodSpec::default() };
        Pod { spec: Some(spec), ..Pod::default() }
    }

    #[test]
    fn the_fs_user_is_the_one_user_every_container_runs_as() {
        assert_eq!(fs_user(&pod(Some(1000), None, vec![container(None)], vec![container(None)])), Some(1000));
        assert_eq!(fs_user(&pod(None, None, vec![], vec![container(Some(7)), container(Some(7))])), Some(7));
        assert_eq!(fs_user(&pod(Some(1000), None, vec![container(Some(0))], vec![container(None)])), None, "two users");
        assert_eq!(
            fs_user(&pod(None, None, vec![], vec![container(Some(7)), container(None)])),
            None,
            "the image's user"
        );
        assert_eq!(fs_user(&pod(None, None, vec![], vec![])), None);
    }

    #[test]
    fn the_fs_group_is_the_pods() {
        assert_eq!(fs_group(&pod(None, Some(2000), vec![], vec![])), Group(Some(2000)));
        assert_eq!(fs_group(&pod(None, None, vec![], vec![])), Group(None));
        assert_eq!(fs_group(&pod(None, Some(-1), vec![], vec![])), Group(None), "the API refuses a negative group");
    }
}
