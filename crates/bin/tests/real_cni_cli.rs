//! `kubelet-rs cni` against Debian's CNI plugins, driven as a cnitool user would.

// Reason: tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{path::Path, process::Command};

use cni::testing::{Netns, RealPlugins, free_subnet, succeeds};
use serde_json::{Value, json};

fn cnitool(conf_dir: &Path, cache: &Path, plugins: &RealPlugins, args: &[&str]) -> (bool, Value, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_kubelet-rs"))
        .arg("cni")
        .args(args)
        .arg("--cache-dir")
        .arg(cache)
        .env("NETCONFPATH", conf_dir)
        .env("CNI_PATH", &plugins.dir)
        .env("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAME=web")
        .env_remove("CNI_IFNAME")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let json =
        if stdout.trim().is_empty() { Value::Null } else { serde_json::from_str(&stdout).unwrap_or(Value::Null) };
    (output.status.success(), json, String::from_utf8_lossy(&output.stderr).into_owned())
}

#[test]
fn real_cni_subcommand_adds_checks_and_deletes_like_cnitool() {
    let Some(plugins) = RealPlugins::from_env("real_cni_subcommand_adds_checks_and_deletes_like_cnitool") else {
        return;
    };
    let scratch = tempfile::tempdir().unwrap();
    let (conf_dir, cache, ipam) =
        (scratch.path().join("net.d"), scratch.path().join("cache"), scratch.path().join("ipam"));
    std::fs::create_dir_all(&conf_dir).unwrap();
    let subnet = free_subnet();
    let bridge = format!("kcli{}", std::process::id() % 100_000);
    let conflist = json!({"cniVersion": "1.0.0", "name": "clinet", "plugins": [{
        "type": "bridge", "bridge": bridge, "isGateway": true,
        "ipam": {"type": "host-local", "subnet": subnet.to_string(), "dataDir": ipam}}]});
    std::fs::write(conf_dir.join("10-clinet.conflist"), serde_json::to_vec(&conflist).unwrap()).unwrap();
    let newer = json!({"cniVersion": "1.1.0", "name": "newer", "plugins": [{"type": "loopback"}]});
    std::fs::write(conf_dir.join("20-newer.conflist"), serde_json::to_vec(&newer).unwrap()).unwrap();
    let netns = Netns::create("kcli");
    let ns = netns.path();
    let ns = ns.to_str().unwrap();

    let outcome = std::panic::catch_unwind(|| {
        let (ok, result, stderr) = cnitool(&conf_dir, &cache, &plugins, &["add", "clinet", ns]);
        assert!(ok, "add: {stderr}");
        assert_eq!(result["cniVersion"], "1.0.0");
        let address = result["ips"][0]["address"].as_str().expect("an address").to_owned();
        let ip = address.split('/').next().unwrap();
        assert!(subnet.contains(&ip.parse::<std::net::Ipv4Addr>().unwrap()), "{address} not in {subnet}");
        assert!(succeeds(Command::new("ping").args(["-c", "1", "-W", "5", ip])), "host cannot ping {ip}");
        // The cache file is named as cnitool and libcni name it.
        let cached: Vec<String> = std::fs::read_dir(cache.join("results"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            cached.len() == 1 && cached[0].starts_with("clinet-cnitool-") && cached[0].ends_with("-eth0"),
            "{cached:?}"
        );

        let (ok, _, stderr) = cnitool(&conf_dir, &cache, &plugins, &["check", "clinet", ns]);
        assert!(ok, "check: {stderr}");
        let (ok, out, stderr) = cnitool(&conf_dir, &cache, &plugins, &["del", "clinet", ns]);
        assert!(ok && out.is_null(), "del: {stderr} {out}");
        assert!(std::fs::read_dir(cache.join("results")).unwrap().next().is_none(), "DEL left the cache entry");
        let (ok, _, stderr) = cnitool(&conf_dir, &cache, &plugins, &["del", "clinet", ns]);
        assert!(ok, "second del: {stderr}");

        // Errors: a clear message on stderr, the CNI error JSON on stdout, exit 1.
        let (ok, error, stderr) = cnitool(&conf_dir, &cache, &plugins, &["add", "nosuchnet", ns]);
        assert!(!ok && stderr.contains("nosuchnet"), "{stderr}");
        assert_eq!(error["code"], 7, "{error}");
        let (ok, error, stderr) = cnitool(&conf_dir, &cache, &plugins, &["add", "newer", ns]);
        assert!(!ok, "{stderr}");
        assert_eq!(error["code"], 1, "{error}");
        assert!(error["details"].as_str().unwrap_or_default().contains("1.1.0"), "{error}");
        // STATUS of a 1.1.0 list whose plugin does not support 1.1.0 asks nobody and succeeds.
        let (ok, _, stderr) = cnitool(&conf_dir, &cache, &plugins, &["status", "newer", ns]);
        assert!(ok, "status: {stderr}");
    });
    drop(netns);
    let _ = Command::new("ip").args(["link", "del", &bridge]).output();
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}
