//! The example agent (`crates/sdk/examples/process_agent.rs`) run as a user would: a static
//! pod in a fresh manifest directory must be reported Running through its local API, with its
//! container restarted by its restart policy, and gone once the manifest is removed.

use std::{
    fs,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::{
    harness,
    util::{project_root, run},
};

const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: sleeper}\nspec:\n  containers:\n  - {name: main, image: none, command: [sh, -c, 'sleep 1; exit 3']}\n";

/// Builds the example, runs it on a scratch directory, and checks what its API reports.
pub(crate) fn check() -> Result<()> {
    run(crate::ci::cargo().args(["build", "-p", "kubelet-sdk", "--example", "process_agent", "--locked"]))?;
    let scratch = project_root()?.join("target/example-agent");
    let _ = fs::remove_dir_all(&scratch);
    let (manifests, root) = (scratch.join("manifests"), scratch.join("root"));
    fs::create_dir_all(&manifests)?;
    fs::write(manifests.join("sleeper.yaml"), POD)?;
    let binary = project_root()?.join("target/debug/examples/process_agent");
    let mut agent = Command::new(&binary)
        .args([&manifests, &root])
        .stdout(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    let socket = root.join("kubelet-rs.sock");
    let outcome = (|| -> Result<()> {
        let restarted = wait(&socket, |pod| pod["status"]["containerStatuses"][0]["restartCount"].as_i64() >= Some(1))
            .context("the example's pod never ran and restarted (restartPolicy Always)")?;
        println!(
            "example agent: {} restarted {} times",
            restarted["metadata"]["name"], restarted["status"]["containerStatuses"][0]["restartCount"]
        );
        fs::remove_file(manifests.join("sleeper.yaml"))?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if harness::get(&socket, "/pods").is_ok_and(|(_, body)| !body.contains("sleeper")) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        bail!("the example's pod was not removed with its manifest")
    })();
    let _ = agent.kill();
    let _ = agent.wait();
    outcome
}

/// The first pod of the example's `/pods` for which `done` holds, within 30 s.
fn wait(socket: &std::path::Path, done: impl Fn(&serde_json::Value) -> bool) -> Option<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Ok((200, body)) = harness::get(socket, "/pods")
            && let Ok(list) = serde_json::from_str::<serde_json::Value>(&body)
            && let Some(pod) = list["items"].as_array().and_then(|items| items.iter().find(|p| done(p)))
        {
            return Some(pod.clone());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    None
}
