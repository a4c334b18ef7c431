//! Which events a container's state change produces (upstream `generateEvents` in
//! `pkg/kubelet/pleg/generic.go`).

use kubelet_core::{
    PodLifecycleEvent, PodLifecycleEventKind, PodUid,
    runtime::{ContainerState, Pod, SandboxState},
};

/// A container's (or sandbox's) state as the PLEG compares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum PlegState {
    Running,
    Exited,
    Unknown,
    NonExistent,
}

impl From<ContainerState> for PlegState {
    fn from(state: ContainerState) -> Self {
        match state {
            ContainerState::Running => PlegState::Running,
            ContainerState::Exited => PlegState::Exited,
            // A created container has not run yet: upstream maps it to unknown.
            ContainerState::Created | ContainerState::Unknown => PlegState::Unknown,
        }
    }
}

impl From<SandboxState> for PlegState {
    fn from(state: SandboxState) -> Self {
        match state {
            SandboxState::Ready => PlegState::Running,
            SandboxState::NotReady => PlegState::Exited,
        }
    }
}

/// The state of container (or sandbox) `id` in `pod`, if the pod lists it.
pub(crate) fn state_in(pod: Option<&Pod>, id: &str) -> PlegState {
    let Some(pod) = pod else { return PlegState::NonExistent };
    if let Some(c) = pod.containers.iter().find(|c| c.id == id) {
        return c.state.into();
    }
    if let Some(s) = pod.sandboxes.iter().find(|s| s.id == id) {
        return s.state.into();
    }
    PlegState::NonExistent
}

/// The events for one container going from `old` to `new`.
pub(crate) fn generate(uid: &PodUid, id: &str, old: PlegState, new: PlegState) -> Vec<PodLifecycleEvent> {
    let event = |kind| PodLifecycleEvent::new(uid.clone(), kind, Some(id.to_owned()));
    if old == new {
        return Vec::new();
    }
    match new {
        PlegState::Running => vec![event(PodLifecycleEventKind::ContainerStarted)],
        PlegState::Exited => vec![event(PodLifecycleEventKind::ContainerDied)],
        PlegState::Unknown => vec![event(PodLifecycleEventKind::ContainerChanged)],
        // A container gone without an observed exit died first.
        PlegState::NonExistent if old == PlegState::Exited => vec![event(PodLifecycleEventKind::ContainerRemoved)],
        PlegState::NonExistent => {
            vec![event(PodLifecycleEventKind::ContainerDied), event(PodLifecycleEventKind::ContainerRemoved)]
        }
    }
}

/// Every container and sandbox ID of the two pods, once each, old pod's first.
pub(crate) fn all_ids<'a>(old: Option<&'a Pod>, new: Option<&'a Pod>) -> Vec<&'a str> {
    let mut ids: Vec<&str> = Vec::new();
    for pod in [old, new].into_iter().flatten() {
        for id in pod.containers.iter().map(|c| c.id.as_str()).chain(pod.sandboxes.iter().map(|s| s.id.as_str())) {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_pair() {
        use PlegState::{Exited as E, NonExistent as N, Running as R, Unknown as U};
        use PodLifecycleEventKind::{
            ContainerChanged as Changed, ContainerDied as Died, ContainerRemoved as Removed,
            ContainerStarted as Started,
        };
        let table: [(PlegState, PlegState, &[PodLifecycleEventKind]); 16] = [
            (N, N, &[]),
            (N, R, &[Started]),
            (N, E, &[Died]),
            (N, U, &[Changed]),
            (R, N, &[Died, Removed]),
            (R, R, &[]),
            (R, E, &[Died]),
            (R, U, &[Changed]),
            (E, N, &[Removed]),
            (E, R, &[Started]),
            (E, E, &[]),
            (E, U, &[Changed]),
            (U, N, &[Died, Removed]),
            (U, R, &[Started]),
            (U, E, &[Died]),
            (U, U, &[]),
        ];
        let uid = PodUid::new("p");
        for (old, new, want) in table {
            let got: Vec<_> = generate(&uid, "c1", old, new).into_iter().map(|e| e.kind).collect();
            assert_eq!(got, want, "{old:?} -> {new:?}");
        }
        assert!(generate(&uid, "c1", R, E).iter().all(|e| e.container_id.as_deref() == Some("c1") && e.id == uid));
    }

    #[test]
    fn created_maps_to_unknown_and_sandboxes_count() {
        assert_eq!(PlegState::from(ContainerState::Created), PlegState::Unknown);
        assert_eq!(PlegState::from(SandboxState::NotReady), PlegState::Exited);
        let mut pod = Pod::new(PodUid::new("p"), "p", "ns");
        pod.sandboxes.push(kubelet_core::runtime::Sandbox::new("s1", 0, SandboxState::Ready));
        pod.containers.push(kubelet_core::runtime::Container::new("c1", "app", ContainerState::Exited));
        assert_eq!(state_in(Some(&pod), "s1"), PlegState::Running);
        assert_eq!(state_in(Some(&pod), "c1"), PlegState::Exited);
        assert_eq!(state_in(Some(&pod), "zz"), PlegState::NonExistent);
        assert_eq!(state_in(None, "c1"), PlegState::NonExistent);
        assert_eq!(all_ids(Some(&pod), Some(&pod)), ["c1", "s1"]);
    }
}
