//! The library's own cost per ADD and DEL, over what the plugins themselves take.
//!
//! 1. Always: ADD and DEL of a two-plugin list with an executor that answers at once, so what
//!    is measured is the library alone (configuration building, JSON, version conversion, the
//!    result cache write and read).
//! 2. As root with Debian's plugins: ADD and DEL through the library next to a bare fork+exec
//!    of the same plugins with the same input, loopback and bridge + host-local; the difference
//!    of the medians is the library's overhead (target: under 1 ms).

// Reason: a benchmark may panic on broken setup, and measures real wall time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods, missing_docs)]

use std::{
    io,
    path::{Path, PathBuf},
    process::Stdio,
    sync::Arc,
    time::{Duration, Instant},
};

use criterion::Criterion;
use kubelet_cni::{
    Cache, Cni, Command, Exec, Exit, Invocation, NetworkList, Output, RuntimeConf,
    testing::{Netns, RealPlugins, free_subnet},
};
use serde_json::json;
use tokio::io::AsyncWriteExt;

/// Answers like bridge + host-local do, without any process.
struct Immediate;

#[async_trait::async_trait]
impl Exec for Immediate {
    async fn exec(&self, _plugin: &Path, invocation: &Invocation, _stdin: &[u8]) -> io::Result<Output> {
        let stdout = match invocation.command {
            Command::Add => br#"{"cniVersion":"1.0.0","interfaces":[{"name":"cni0","mac":"22:5c:00:00:00:01"},{"name":"veth1","mac":"16:38:00:00:00:02"},{"name":"eth0","mac":"72:28:00:00:00:03","sandbox":"/var/run/netns/x"}],"ips":[{"interface":2,"address":"10.213.0.7/24","gateway":"10.213.0.1"}],"routes":[{"dst":"0.0.0.0/0"}],"dns":{}}"#.to_vec(),
            _ => Vec::new(),
        };
        Ok(Output::new(Exit::Code(0), stdout, Vec::new()))
    }

    fn find(&self, plugin_type: &str, paths: &[PathBuf]) -> Option<PathBuf> {
        Some(paths[0].join(plugin_type))
    }
}

fn list(value: serde_json::Value) -> NetworkList {
    NetworkList::from_slice(&serde_json::to_vec(&value).unwrap()).unwrap()
}

fn library_alone(c: &mut Criterion, tokio: &tokio::runtime::Runtime) {
    let cache = tempfile::tempdir().unwrap();
    let cni = Cni::new(vec!["/plugins".into()]).with_exec(Arc::new(Immediate)).with_cache(Cache::new(cache.path()));
    let network = list(json!({"cniVersion":"1.0.0","name":"bench","plugins":[
        {"type":"bridge","bridge":"cni0","isGateway":true,"ipam":{"type":"host-local","subnet":"10.213.0.0/24"}},
        {"type":"portmap","capabilities":{"portMappings":true}}]}));
    let rt = RuntimeConf::new("bench-1", "/var/run/netns/x", "eth0")
        .with_capability("portMappings", json!([{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]));
    c.bench_function("cni library alone: ADD then DEL, 2 plugins, cache on disk", |b| {
        b.iter(|| {
            tokio.block_on(async {
                cni.add_network_list(&network, &rt).await.unwrap();
                cni.del_network_list(&network, &rt).await.unwrap();
            })
        })
    });
}

/// A bare fork+exec of one plugin with the given input, as a shell script would do it.
async fn bare(plugin: &Path, command: &str, rt: &RuntimeConf, stdin: &[u8], path: &Path) -> Vec<u8> {
    let mut child = tokio::process::Command::new(plugin)
        .env_clear()
        .env("PATH", kubelet_cni::DEFAULT_PATH)
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", &rt.container_id)
        .env("CNI_NETNS", &rt.netns)
        .env("CNI_IFNAME", &rt.ifname)
        .env("CNI_PATH", path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).await.unwrap();
    let output = child.wait_with_output().await.unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stdout));
    output.stdout
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// Times ADD and DEL `rounds` times, through the library and bare, interleaved so both see the
/// same machine, and prints the medians.
async fn compare(what: &str, plugins: &RealPlugins, network: &NetworkList, rt: &RuntimeConf, rounds: usize) {
    let cache = tempfile::tempdir().unwrap();
    let cni = Cni::new(vec![plugins.dir.clone()]).with_cache(Cache::new(cache.path()));
    let plugin = network.plugins[0].clone();
    let mut stdin = serde_json::to_value(&plugin).unwrap();
    stdin["name"] = json!(network.name);
    stdin["cniVersion"] = json!(network.cni_version.to_string());
    let add_stdin = serde_json::to_vec(&stdin).unwrap();
    let binary = plugins.dir.join(&plugin.plugin_type);
    let (mut lib_add, mut lib_del, mut bare_add, mut bare_del) = (vec![], vec![], vec![], vec![]);
    for _ in 0..rounds {
        let t = Instant::now();
        cni.add_network_list(network, rt).await.unwrap();
        lib_add.push(t.elapsed());
        let t = Instant::now();
        cni.del_network_list(network, rt).await.unwrap();
        lib_del.push(t.elapsed());
        let t = Instant::now();
        let result = bare(&binary, "ADD", rt, &add_stdin, &plugins.dir).await;
        bare_add.push(t.elapsed());
        // DEL gets the result as prevResult, as the library sends it.
        let mut del_stdin = stdin.clone();
        del_stdin["prevResult"] = serde_json::from_slice(&result).unwrap();
        let del_stdin = serde_json::to_vec(&del_stdin).unwrap();
        let t = Instant::now();
        bare(&binary, "DEL", rt, &del_stdin, &plugins.dir).await;
        bare_del.push(t.elapsed());
    }
    for (op, library, bare) in [("ADD", lib_add, bare_add), ("DEL", lib_del, bare_del)] {
        let (library, bare) = (median(library), median(bare));
        let overhead = library.as_secs_f64() * 1e3 - bare.as_secs_f64() * 1e3;
        println!(
            "cni {what} {op}: library {:.2} ms, bare fork+exec {:.2} ms, overhead {overhead:+.2} ms (median of {rounds})",
            library.as_secs_f64() * 1e3,
            bare.as_secs_f64() * 1e3,
        );
    }
}

fn against_real_plugins(tokio: &tokio::runtime::Runtime) {
    let Some(plugins) = RealPlugins::from_env("cni overhead against the real plugins") else { return };
    let netns = Netns::create("kcni-bench");
    let bridge = format!("kcnib{}", std::process::id() % 10_000);
    let ipam = tempfile::tempdir().unwrap();
    tokio.block_on(async {
        let lo = list(json!({"cniVersion":"1.0.0","name":"bench-lo","plugins":[{"type":"loopback"}]}));
        compare("loopback", &plugins, &lo, &RuntimeConf::new("bench-lo", netns.path().to_string_lossy(), "lo"), 30)
            .await;
        let br = list(json!({"cniVersion":"1.0.0","name":"bench-br","plugins":[{"type":"bridge","bridge":bridge,
            "ipam":{"type":"host-local","subnet":free_subnet().to_string(),"dataDir":ipam.path()}}]}));
        compare(
            "bridge+host-local",
            &plugins,
            &br,
            &RuntimeConf::new("bench-br", netns.path().to_string_lossy(), "eth0"),
            30,
        )
        .await;
    });
    drop(netns);
    let _ = std::process::Command::new("ip").args(["link", "del", &bridge]).output();
}

fn main() {
    let tokio = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut c = Criterion::default().configure_from_args();
    library_alone(&mut c, &tokio);
    c.final_summary();
    against_real_plugins(&tokio);
}
