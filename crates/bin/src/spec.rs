//! `/spec/` on the kubelet API: the machine as upstream's kubelet describes it (cAdvisor's
//! `MachineInfo`), with the fields that have a source here: the CPUs, memory, swap and huge pages,
//! and the machine's, system's and boot's IDs. Read when asked.

use std::collections::BTreeSet;

use axum::{Json, Router, routing::get};
use serde_json::{Value, json};

/// The routes: `/spec` and `/spec/`, as upstream answers both.
pub(crate) fn router() -> Router {
    Router::new().route("/spec", get(spec)).route("/spec/", get(spec))
}

async fn spec() -> Json<Value> {
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    let host = Host {
        cpuinfo: read("/proc/cpuinfo"),
        meminfo: read("/proc/meminfo"),
        max_frequency_khz: read("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").trim().parse().ok(),
        machine_id: read("/etc/machine-id").trim().to_owned(),
        system_uuid: read("/sys/class/dmi/id/product_uuid").trim().to_owned(),
        boot_id: read("/proc/sys/kernel/random/boot_id").trim().to_owned(),
        hugepages: kubelet::admission::NodeResources::of_this_node().hugepages.into_iter().collect(),
    };
    Json(machine_info(&host, &k8s_openapi::jiff::Timestamp::now().to_string()))
}

/// What `/spec/` is made of.
struct Host {
    cpuinfo: String,
    meminfo: String,
    /// `cpufreq`'s maximum, when the kernel has one.
    max_frequency_khz: Option<u64>,
    machine_id: String,
    system_uuid: String,
    boot_id: String,
    /// Bytes allocated by page size, in bytes.
    hugepages: Vec<(u64, u64)>,
}

/// cAdvisor's `MachineInfo` JSON of `host` at `timestamp`.
fn machine_info(host: &Host, timestamp: &str) -> Value {
    let processors = processors(&host.cpuinfo);
    let sockets: BTreeSet<&str> = processors.iter().map(|p| p.physical_id).collect();
    let cores: BTreeSet<(&str, &str)> = processors.iter().map(|p| (p.physical_id, p.core_id)).collect();
    let first = processors.first();
    let mhz = first.and_then(|p| p.mhz.parse::<f64>().ok());
    // Reason: a frequency in kHz fits u64 whole; the fraction of a kHz is dropped as cAdvisor drops it.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let frequency_khz = host.max_frequency_khz.or(mhz.map(|mhz| (mhz * 1000.0) as u64)).unwrap_or(0);
    let hugepages: Vec<Value> = host
        .hugepages
        .iter()
        .map(|(page, bytes)| json!({"page_size": page / 1024, "num_pages": bytes / page.max(&1)}))
        .collect();
    json!({
        "timestamp": timestamp,
        "cpu_vendor_id": first.map(|p| p.vendor).unwrap_or_default(),
        "num_cores": processors.len(),
        "num_physical_cores": cores.len(),
        "num_sockets": sockets.len(),
        "cpu_frequency_khz": frequency_khz,
        "memory_capacity": meminfo_bytes(&host.meminfo, "MemTotal"),
        "swap_capacity": meminfo_bytes(&host.meminfo, "SwapTotal"),
        "hugepages": hugepages,
        "machine_id": host.machine_id,
        "system_uuid": host.system_uuid,
        "boot_id": host.boot_id,
        "cloud_provider": "Unknown",
        "instance_type": "Unknown",
        "instance_id": "None",
    })
}

/// One `processor` entry of `/proc/cpuinfo`.
struct Processor<'a> {
    vendor: &'a str,
    physical_id: &'a str,
    core_id: &'a str,
    mhz: &'a str,
}

/// The processors of `/proc/cpuinfo` (entries apart by blank lines).
fn processors(cpuinfo: &str) -> Vec<Processor<'_>> {
    let mut processors = Vec::new();
    for entry in cpuinfo.split("\n\n").filter(|entry| entry.contains("processor")) {
        let field = |name: &str| {
            entry.lines().find_map(|line| {
                let (key, value) = line.split_once(':')?;
                (key.trim() == name).then(|| value.trim())
            })
        };
        processors.push(Processor {
            vendor: field("vendor_id").unwrap_or_default(),
            physical_id: field("physical id").unwrap_or("0"),
            core_id: field("core id").or(field("processor")).unwrap_or("0"),
            mhz: field("cpu MHz").unwrap_or_default(),
        });
    }
    processors
}

/// A `/proc/meminfo` field in bytes.
fn meminfo_bytes(meminfo: &str, field: &str) -> u64 {
    meminfo
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn processor(n: u32, physical: u32, core: u32) -> String {
        format!(
            "processor\t: {n}\nvendor_id\t: GenuineIntel\ncpu MHz\t\t: 2294.608\nphysical id\t: {physical}\n\
             core id\t\t: {core}\n"
        )
    }

    #[test]
    fn the_machine_is_described_as_cadvisor_describes_it() {
        // Two sockets of two cores with two threads each.
        let mut cpuinfo = Vec::new();
        let mut n = 0;
        for physical in 0..2 {
            for core in 0..2 {
                for _thread in 0..2 {
                    cpuinfo.push(processor(n, physical, core));
                    n += 1;
                }
            }
        }
        let host = Host {
            cpuinfo: cpuinfo.join("\n"),
            meminfo: "MemTotal:       24576000 kB\nMemFree:  1 kB\nSwapTotal:       1024 kB\n".to_owned(),
            max_frequency_khz: None,
            machine_id: "m".to_owned(),
            system_uuid: "s".to_owned(),
            boot_id: "b".to_owned(),
            hugepages: vec![(2 << 20, 8 << 20)],
        };
        let info = machine_info(&host, "2026-11-26T00:00:00Z");
        assert_eq!(info["num_cores"], 8);
        assert_eq!(info["num_physical_cores"], 4);
        assert_eq!(info["num_sockets"], 2);
        assert_eq!(info["cpu_frequency_khz"], 2_294_608);
        assert_eq!(info["cpu_vendor_id"], "GenuineIntel");
        assert_eq!(info["memory_capacity"], 24_576_000u64 * 1024);
        assert_eq!(info["swap_capacity"], 1024 * 1024);
        assert_eq!(info["hugepages"], json!([{"page_size": 2048, "num_pages": 4}]));
        assert_eq!(
            (&info["machine_id"], &info["system_uuid"], &info["boot_id"]),
            (&json!("m"), &json!("s"), &json!("b"))
        );

        // cpufreq's maximum wins over cpuinfo's current speed.
        let host = Host { max_frequency_khz: Some(3_000_000), ..host };
        assert_eq!(machine_info(&host, "t")["cpu_frequency_khz"], 3_000_000);
    }
}
