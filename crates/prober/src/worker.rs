//! One probe of one container as a pure state machine (upstream `prober/worker.go` `doProbe`).
//!
//! The task that drives it ([`crate::manager`]) feeds it what the cache shows of the container at
//! each period and the verdict of each probe it asks for; it answers whether to probe, wait or
//! stop, and which results to record.

use std::time::Duration;

use kubelet_core::{ProbeKind, ProbeOutcome};
use tokio::time::Instant;

/// The parts of a probe's spec the state machine needs (defaults are upstream's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Thresholds {
    /// `initialDelaySeconds`, from the container's start.
    pub(crate) initial_delay: Duration,
    /// `successThreshold` (at least 1; 1 for liveness and startup).
    pub(crate) success: u32,
    /// `failureThreshold` (at least 1).
    pub(crate) failure: u32,
}

/// What the cache shows of the probed container at one period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Seen<'a> {
    /// No instance of the container yet.
    Absent,
    /// The newest instance runs, started at `since` (on the tokio clock).
    Running { id: &'a str, since: Instant },
    /// The newest instance is not running; `exited` once it has run and stopped.
    NotRunning { id: &'a str, exited: bool },
}

/// What the driving task does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Nothing this period.
    Wait,
    /// Run the probe against this container.
    Probe(String),
    /// Stop for good: the container will not run again.
    Stop,
}

/// A change to the results store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Effect {
    /// Record a verdict for a container.
    Set(String, ProbeOutcome),
    /// Forget the verdict of a container that was replaced.
    Remove(String),
}

/// The state of one worker.
#[derive(Debug)]
pub(crate) struct Worker {
    kind: ProbeKind,
    thresholds: Thresholds,
    /// The container instance being probed.
    container_id: Option<String>,
    /// After a liveness or startup failure: no probing until a new instance appears.
    on_hold: bool,
    last: Option<ProbeOutcome>,
    run: u32,
}

impl Worker {
    pub(crate) fn new(kind: ProbeKind, thresholds: Thresholds) -> Self {
        Worker { kind, thresholds, container_id: None, on_hold: false, last: None, run: 0 }
    }

    /// One period: `seen` is the container, `started` whether its startup probe has succeeded
    /// (true without one), `restart_never` the pod's restart policy. Result changes go to
    /// `effects`.
    pub(crate) fn tick(
        &mut self,
        seen: Seen<'_>,
        started: bool,
        restart_never: bool,
        now: Instant,
        effects: &mut Vec<Effect>,
    ) -> Step {
        let id = match seen {
            Seen::Absent => return Step::Wait,
            Seen::Running { id, .. } | Seen::NotRunning { id, .. } => id,
        };
        if self.container_id.as_deref() != Some(id) {
            // A new instance: forget the old one's verdict and start from the initial one.
            if let Some(old) = self.container_id.replace(id.to_owned()) {
                effects.push(Effect::Remove(old));
            }
            effects.push(Effect::Set(id.to_owned(), self.kind.initial_outcome()));
            self.on_hold = false;
            self.last = None;
            self.run = 0;
        }
        if self.on_hold {
            return Step::Wait;
        }
        let since = match seen {
            Seen::Running { since, .. } => since,
            Seen::NotRunning { exited, .. } => {
                // A container that does not run is not ready. It gets no liveness or startup
                // failure: those verdicts kill a running container, and one created but not yet
                // started (a relist can fall between CreateContainer and StartContainer) would
                // be killed as soon as it starts.
                if self.kind == ProbeKind::Readiness {
                    effects.push(Effect::Set(id.to_owned(), ProbeOutcome::Failure));
                }
                // A container that exited and never restarts is probed no more.
                return if exited && restart_never { Step::Stop } else { Step::Wait };
            }
            Seen::Absent => return Step::Wait,
        };
        if now.saturating_duration_since(since) < self.thresholds.initial_delay {
            return Step::Wait;
        }
        // The startup probe runs until the container has started; the others only after.
        if started == (self.kind == ProbeKind::Startup) {
            return Step::Wait;
        }
        Step::Probe(id.to_owned())
    }

    /// The verdict of one probe of the current instance: a result is recorded once it has come
    /// `successThreshold` or `failureThreshold` times in a row.
    pub(crate) fn record(&mut self, outcome: ProbeOutcome) -> Option<Effect> {
        let id = self.container_id.clone()?;
        if self.last == Some(outcome) {
            self.run = self.run.saturating_add(1);
        } else {
            self.last = Some(outcome);
            self.run = 1;
        }
        let needed = match outcome {
            ProbeOutcome::Success => self.thresholds.success,
            ProbeOutcome::Failure => self.thresholds.failure,
            _ => return None,
        };
        if self.run < needed {
            return None;
        }
        if outcome == ProbeOutcome::Failure && self.kind != ProbeKind::Readiness {
            // The container is killed; nothing more to probe until its replacement appears.
            self.on_hold = true;
            self.run = 0;
        }
        Some(Effect::Set(id, outcome))
    }

    /// The container instance being probed, if any.
    pub(crate) fn container_id(&self) -> Option<&str> {
        self.container_id.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn thresholds(initial_delay: u64, success: u32, failure: u32) -> Thresholds {
        Thresholds { initial_delay: Duration::from_secs(initial_delay), success, failure }
    }

    fn set(id: &str, outcome: ProbeOutcome) -> Effect {
        Effect::Set(id.to_owned(), outcome)
    }

    #[test]
    fn a_new_container_gets_the_initial_result_and_waits_for_its_initial_delay() {
        let t0 = Instant::now();
        for (kind, initial) in [
            (ProbeKind::Readiness, ProbeOutcome::Failure),
            (ProbeKind::Liveness, ProbeOutcome::Success),
            (ProbeKind::Startup, ProbeOutcome::Unknown),
        ] {
            let mut w = Worker::new(kind, thresholds(5, 1, 3));
            let started = kind != ProbeKind::Startup;
            let mut effects = Vec::new();
            assert_eq!(w.tick(Seen::Absent, started, false, t0, &mut effects), Step::Wait);
            assert!(effects.is_empty());
            let running = Seen::Running { id: "c1", since: t0 };
            assert_eq!(w.tick(running, started, false, t0 + 4 * SECOND, &mut effects), Step::Wait, "{kind:?}");
            assert_eq!(effects, [set("c1", initial)]);
            effects.clear();
            assert_eq!(w.tick(running, started, false, t0 + 5 * SECOND, &mut effects), Step::Probe("c1".into()));
            assert!(effects.is_empty(), "the initial result is set once");
        }
    }

    #[test]
    fn results_flip_only_after_their_thresholds_in_a_row() {
        let mut w = Worker::new(ProbeKind::Readiness, thresholds(0, 2, 3));
        let t0 = Instant::now();
        w.tick(Seen::Running { id: "c1", since: t0 }, true, false, t0, &mut Vec::new());
        assert_eq!(w.record(ProbeOutcome::Success), None, "one success of two");
        assert_eq!(w.record(ProbeOutcome::Success), Some(set("c1", ProbeOutcome::Success)));
        assert_eq!(w.record(ProbeOutcome::Failure), None);
        assert_eq!(w.record(ProbeOutcome::Failure), None);
        assert_eq!(w.record(ProbeOutcome::Success), None, "a success breaks the run of failures");
        assert_eq!(w.record(ProbeOutcome::Failure), None);
        assert_eq!(w.record(ProbeOutcome::Failure), None);
        assert_eq!(w.record(ProbeOutcome::Failure), Some(set("c1", ProbeOutcome::Failure)), "three in a row");
        assert_eq!(w.record(ProbeOutcome::Failure), Some(set("c1", ProbeOutcome::Failure)), "readiness keeps probing");
    }

    #[test]
    fn a_liveness_failure_holds_the_worker_until_a_new_container_appears() {
        let mut w = Worker::new(ProbeKind::Liveness, thresholds(0, 1, 1));
        let t0 = Instant::now();
        let mut effects = Vec::new();
        let first = Seen::Running { id: "c1", since: t0 };
        assert_eq!(w.tick(first, true, false, t0, &mut effects), Step::Probe("c1".into()));
        assert_eq!(w.record(ProbeOutcome::Failure), Some(set("c1", ProbeOutcome::Failure)));
        effects.clear();
        assert_eq!(w.tick(first, true, false, t0 + SECOND, &mut effects), Step::Wait, "held");
        assert_eq!(w.tick(Seen::NotRunning { id: "c1", exited: true }, true, false, t0, &mut effects), Step::Wait);
        assert!(effects.is_empty(), "held: the killed container's failure stays until it is replaced");
        let second = Seen::Running { id: "c2", since: t0 + 2 * SECOND };
        assert_eq!(w.tick(second, true, false, t0 + 2 * SECOND, &mut effects), Step::Probe("c2".into()));
        assert_eq!(effects, [Effect::Remove("c1".into()), set("c2", ProbeOutcome::Success)]);
        assert_eq!(w.container_id(), Some("c2"));
    }

    #[test]
    fn startup_gates_the_other_probes_and_stops_once_started() {
        let t0 = Instant::now();
        let running = Seen::Running { id: "c1", since: t0 };
        let mut startup = Worker::new(ProbeKind::Startup, thresholds(0, 1, 3));
        let mut liveness = Worker::new(ProbeKind::Liveness, thresholds(0, 1, 3));
        let mut effects = Vec::new();
        assert_eq!(startup.tick(running, false, false, t0, &mut effects), Step::Probe("c1".into()));
        assert_eq!(liveness.tick(running, false, false, t0, &mut effects), Step::Wait, "not started yet");
        assert_eq!(startup.record(ProbeOutcome::Success), Some(set("c1", ProbeOutcome::Success)));
        assert_eq!(startup.tick(running, true, false, t0, &mut effects), Step::Wait, "started: no more startup probes");
        assert_eq!(liveness.tick(running, true, false, t0, &mut effects), Step::Probe("c1".into()));
    }

    #[test]
    fn a_stopped_container_fails_and_stops_the_worker_only_when_it_never_restarts() {
        let t0 = Instant::now();
        let mut w = Worker::new(ProbeKind::Readiness, thresholds(0, 1, 3));
        let mut effects = Vec::new();
        w.tick(Seen::Running { id: "c1", since: t0 }, true, false, t0, &mut effects);
        effects.clear();
        let created = Seen::NotRunning { id: "c1", exited: false };
        assert_eq!(w.tick(created, true, true, t0, &mut effects), Step::Wait);
        assert_eq!(effects, [set("c1", ProbeOutcome::Failure)]);
        let exited = Seen::NotRunning { id: "c1", exited: true };
        assert_eq!(w.tick(exited, true, false, t0, &mut Vec::new()), Step::Wait, "it restarts");
        assert_eq!(w.tick(exited, true, true, t0, &mut Vec::new()), Step::Stop, "restartPolicy Never");
    }

    #[test]
    fn a_container_not_yet_started_gets_no_liveness_or_startup_failure() {
        let t0 = Instant::now();
        for (kind, initial) in
            [(ProbeKind::Startup, ProbeOutcome::Unknown), (ProbeKind::Liveness, ProbeOutcome::Success)]
        {
            let started = kind != ProbeKind::Startup;
            let mut w = Worker::new(kind, thresholds(0, 1, 30));
            let mut effects = Vec::new();
            let created = Seen::NotRunning { id: "c1", exited: false };
            assert_eq!(w.tick(created, started, false, t0, &mut effects), Step::Wait);
            assert_eq!(effects, [set("c1", initial)], "{kind:?}: only the initial result");
            effects.clear();
            let running = Seen::Running { id: "c1", since: t0 + SECOND };
            assert_eq!(w.tick(running, started, false, t0 + SECOND, &mut effects), Step::Probe("c1".into()));
            assert!(effects.is_empty(), "{kind:?}: no failure carried into the running container");
            assert_eq!(w.record(ProbeOutcome::Failure), None, "{kind:?}: one failure of thirty");
            let exited = Seen::NotRunning { id: "c1", exited: true };
            assert_eq!(w.tick(exited, started, false, t0 + 2 * SECOND, &mut effects), Step::Wait);
            assert!(effects.is_empty(), "{kind:?}: the restart is the sync loop's, not a probe verdict");
        }
    }

    #[test]
    fn verdicts_without_a_container_or_unknown_record_nothing() {
        let mut w = Worker::new(ProbeKind::Readiness, thresholds(0, 1, 1));
        assert_eq!(w.record(ProbeOutcome::Success), None);
        let t0 = Instant::now();
        w.tick(Seen::Running { id: "c1", since: t0 }, true, false, t0, &mut Vec::new());
        assert_eq!(w.record(ProbeOutcome::Unknown), None);
    }
}
