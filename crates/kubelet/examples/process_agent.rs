//! A node agent whose runtime runs each container's `command` and `args` as a host process (no image, no isolation)
//! with the library's sync loop, pod workers, PLEG, status, static pods and local API: `process_agent MANIFESTS ROOT`.
use k8s_openapi::api::core::v1::Pod as Spec;
use kubelet_config::{PodConfig, file};
use kubelet_core::runtime::{ContainerState::Exited, ContainerState::Running, *};
use kubelet_core::volume::PodVolumes as Volumes;
use kubelet_core::{Backoff, PodUid, ProbeResults as Probes, Source, clock::wall_now, events::RingRecorder};
use kubelet_node::{Agent, agent, server};
use std::{collections::HashMap, path::PathBuf, sync::Arc};
use tokio::{process::Child, sync::Mutex};
/// Each pod's status (newest container instance first) and its processes by container ID.
type Pods = HashMap<PodUid, (PodStatus, HashMap<String, Child>)>;
struct Processes(Mutex<Pods>);
impl Runtime for Processes {
    type Error = std::io::Error;
    async fn version(&self) -> Result<Version, Self::Error> {
        Ok(Version::new("processes", "0.1.0", "v1"))
    }
    async fn status(&self) -> Result<RuntimeStatus, Self::Error> {
        Ok(RuntimeStatus::ready())
    }
    async fn get_pods(&self, _: bool) -> Result<Vec<Pod>, Self::Error> {
        Ok(self.0.lock().await.values_mut().map(|(pod, children)| reap(pod, children).to_running_pod()).collect())
    }
    async fn get_pod_status(&self, uid: &PodUid, name: &str, ns: &str) -> Result<PodStatus, Self::Error> {
        Ok(self.0.lock().await.get_mut(uid).map_or(PodStatus::new(uid.clone(), name, ns), |(p, c)| reap(p, c).clone()))
    }
    async fn sync_pod(&self, pod: &Spec, _: &PodStatus, _: &Backoff, _: &Probes, _: &Volumes) -> PodSyncResult {
        let (spec, mut pods) = (pod.spec.clone().unwrap_or_default(), self.0.lock().await);
        let (record, children) = pods.entry(PodUid::of(pod)).or_insert_with(|| (PodStatus::of(pod), HashMap::new()));
        let again = |x| !matches!((spec.restart_policy.as_deref(), x), (Some("Never"), _) | (Some("OnFailure"), 0));
        for c in &spec.containers {
            let (last, argv) = (record.container_status(&c.name), c.command.iter().chain(&c.args).flatten());
            let due = last.is_none_or(|l| l.state == Exited && again(l.exit_code));
            let (Some(program), true) = (argv.clone().next(), due) else { continue };
            let count = last.map_or(0, |l| l.restart_count + 1);
            let mut started = ContainerStatus::new(format!("{}-{}-{count}", record.uid, c.name), &c.name, Running);
            (started.started_at, started.restart_count) = (Some(wall_now()), count);
            match tokio::process::Command::new(program).args(argv.skip(1)).kill_on_drop(true).spawn() {
                Ok(child) => _ = children.insert(started.id.clone(), child),
                Err(e) => (started.state, started.exit_code, started.message) = (Exited, 127, e.to_string()),
            }
            record.container_statuses.insert(0, started);
        }
        PodSyncResult::default()
    }
    async fn kill_pod(&self, _: Option<&Spec>, running: &Pod, _: Option<i64>) -> Result<(), Self::Error> {
        let mut pods = self.0.lock().await;
        let Some((pod, children)) = pods.get_mut(&running.uid) else { return Ok(()) };
        futures::future::try_join_all(children.values_mut().map(Child::kill)).await?;
        reap(pod, children);
        Ok(())
    }
}
/// Marks the containers whose process ended as exited, with its exit code.
fn reap<'a>(pod: &'a mut PodStatus, children: &mut HashMap<String, Child>) -> &'a PodStatus {
    for c in pod.container_statuses.iter_mut().filter(|c| c.state == Running) {
        if let Some(Ok(Some(exit))) = children.get_mut(&c.id).map(Child::try_wait) {
            (c.state, c.exit_code, c.finished_at) = (Exited, exit.code().unwrap_or(137), Some(wall_now()));
        }
    }
    pod
}
#[tokio::main]
#[expect(clippy::unwrap_used, reason = "an example: a wrong argument or a taken socket ends it")]
async fn main() {
    let [dir, root]: [PathBuf; 2] = std::env::args().skip(1).map(PathBuf::from).collect::<Vec<_>>().try_into().unwrap();
    let events = Arc::new(RingRecorder::default());
    let config = agent::Config::new(kubelet_node::Config::new("node-1").root_dir(&root), [Source::File]);
    let agent = Agent::builder(Arc::new(Processes(Mutex::default())), config).recorder(events.clone()).build(
        |runtime, cache| kubelet_pleg::GenericPleg::new(runtime, cache, Default::default()),
        |p| kubelet_podworkers::PodWorkers::new(p.syncer, p.cache, p.work_queue, Default::default(), p.cancel),
    );
    let (pods, updates) = PodConfig::new(events.clone());
    let files = file::FileSource::new(file::Config::new(dir, "node-1"), pods.source(Source::File), events.clone());
    tokio::spawn(files.run(Default::default()));
    let api = Arc::new(server::ApiState::of(&agent, events, root.join("logs")));
    server::serve_unix(&server::socket_path(&root), server::local_router(api), Default::default()).await.unwrap();
    agent.run(updates).await;
}
