//! Writing a [`ResourceConfig`] into a cgroup on the cgroupfs driver, cgroup v1 or v2.

use std::{
    collections::BTreeSet,
    io::{self, Write},
    path::{Path, PathBuf},
};

use kubelet_core::cgroups::{PodCgroupError, relative_cgroup_path};

use crate::resource_config::{ResourceConfig, shares_to_weight};

/// Which cgroup version the mount holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Version {
    /// One hierarchy per controller (`cpu/`, `memory/`, `pids/` below the mount).
    V1,
    /// The unified hierarchy at the mount itself.
    V2,
}

/// The v1 controllers this crate writes to, and so makes its cgroups in (hugetlb where the
/// kernel has it).
const V1_CONTROLLERS: [&str; 4] = ["cpu", "memory", "pids", "hugetlb"];
/// The v1 controllers in which upstream's `Validate` looks for an existing cgroup.
const V1_VALIDATED_CONTROLLERS: [&str; 6] = ["cpu", "cpuacct", "cpuset", "memory", "pids", "hugetlb"];
/// The v2 controllers upstream's `Validate` wants enabled in an existing cgroup.
const V2_VALIDATED_CONTROLLERS: [&str; 5] = ["cpu", "cpuset", "hugetlb", "memory", "pids"];
/// What a v2 parent must hand down for its children to have the files this crate writes.
const V2_SUBTREE_CONTROL: &str = "+cpu +memory +pids";

/// Cgroups below a cgroup mount (`/sys/fs/cgroup`), on the cgroupfs driver.
#[derive(Clone, Debug)]
pub struct Cgroupfs {
    mount: PathBuf,
    version: Version,
}

impl Cgroupfs {
    /// The cgroups below `mount`, whose version is read from it: v2 when it has
    /// `cgroup.controllers`.
    pub fn detect(mount: impl Into<PathBuf>) -> Self {
        let mount = mount.into();
        let version = if mount.join("cgroup.controllers").exists() { Version::V2 } else { Version::V1 };
        Cgroupfs { mount, version }
    }

    /// The cgroups below `mount`, of `version`.
    pub fn new(mount: impl Into<PathBuf>, version: Version) -> Self {
        Cgroupfs { mount: mount.into(), version }
    }

    /// The version of the mount.
    pub fn version(&self) -> Version {
        self.version
    }

    /// Whether cgroup `name` (`/kubepods/burstable/pod<uid>`) exists (under the cpu controller
    /// on v1).
    pub fn exists(&self, name: &str) -> bool {
        relative_cgroup_path(name).is_ok_and(|r| self.dirs(r).first().is_some_and(|d| d.is_dir()))
    }

    /// The names of the child cgroups of `name` in any hierarchy written to (a child missing
    /// from one controller is still found in the others); none when `name` does not exist.
    pub fn children(&self, name: &str) -> Result<BTreeSet<String>, PodCgroupError> {
        let relative = relative_cgroup_path(name).map_err(|e| PodCgroupError::new("naming", name, e))?;
        let mut children = BTreeSet::new();
        for dir in self.dirs(relative) {
            let entries = match std::fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
                Err(err) => return Err(PodCgroupError::new("listing", dir.display().to_string(), err)),
            };
            for entry in entries.filter_map(Result::ok) {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    children.insert(entry.file_name().to_string_lossy().into_owned());
                }
            }
        }
        Ok(children)
    }

    /// Makes cgroup `name` where missing, in every controller this crate writes, and writes
    /// `config` into it.
    pub fn apply(&self, name: &str, config: &ResourceConfig) -> Result<(), PodCgroupError> {
        let relative = relative_cgroup_path(name).map_err(|e| PodCgroupError::new("naming", name, e))?;
        match self.version {
            Version::V1 => {
                for dir in self.dirs(relative) {
                    std::fs::create_dir_all(&dir)
                        .map_err(|e| PodCgroupError::new("making", dir.display().to_string(), e))?;
                }
            }
            Version::V2 => self.make_handing_down_controllers(relative)?,
        }
        self.write_files(relative, config)
    }

    /// Writes `config` into cgroup `name`, which must exist already (upstream's
    /// `enforceExistingCgroup`, for the system and Kubernetes daemons' cgroups), as upstream's
    /// `Validate` checks: in every v1 controller it looks at that is mounted here, or, on v2,
    /// with the controllers it looks at that the root has.
    pub fn update_existing(&self, name: &str, config: &ResourceConfig) -> Result<(), PodCgroupError> {
        let relative = relative_cgroup_path(name).map_err(|e| PodCgroupError::new("naming", name, e))?;
        let missing = match self.version {
            Version::V1 => self.missing_v1_paths(relative).map(|paths| format!("some missing paths: {paths}")),
            Version::V2 => self.missing_v2_controllers(relative).map(|c| format!("some missing controllers: {c}")),
        };
        if let Some(missing) = missing {
            let err = io::Error::new(io::ErrorKind::NotFound, format!("cgroup {name:?} has {missing}"));
            return Err(PodCgroupError::new("validating", name, err));
        }
        self.write_files(relative, config)
    }

    /// The directories of `relative` missing in the v1 controllers upstream validates.
    fn missing_v1_paths(&self, relative: &Path) -> Option<String> {
        let missing: Vec<String> = V1_VALIDATED_CONTROLLERS
            .iter()
            .map(|controller| self.mount.join(controller))
            .filter(|hierarchy| hierarchy.is_dir())
            .map(|hierarchy| hierarchy.join(relative))
            .filter(|dir| !dir.is_dir())
            .map(|dir| dir.display().to_string())
            .collect();
        (!missing.is_empty()).then(|| missing.join(", "))
    }

    /// The controllers upstream validates that the root has and `relative` lacks (all of them
    /// when it does not exist).
    fn missing_v2_controllers(&self, relative: &Path) -> Option<String> {
        let controllers = |dir: &Path| {
            let listed = std::fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
            listed.split_whitespace().map(str::to_owned).collect::<Vec<_>>()
        };
        let root = controllers(&self.mount);
        let enabled = controllers(&self.mount.join(relative));
        let missing: Vec<&str> = V2_VALIDATED_CONTROLLERS
            .into_iter()
            .filter(|c| root.iter().any(|r| r == c) && !enabled.iter().any(|e| e == c))
            .collect();
        (!missing.is_empty()).then(|| missing.join(", "))
    }

    /// Writes the files `config` sets into the existing cgroup at `relative`.
    fn write_files(&self, relative: &Path, config: &ResourceConfig) -> Result<(), PodCgroupError> {
        for (file, value) in self.files(config) {
            let path = match self.version {
                Version::V1 => self.v1_file(relative, &file),
                Version::V2 => self.mount.join(relative).join(&file),
            };
            write(&path, &value).map_err(|e| PodCgroupError::new("writing", path.display().to_string(), e))?;
        }
        Ok(())
    }

    /// A v1 cgroup file, in the hierarchy of the controller its name starts with.
    fn v1_file(&self, relative: &Path, file: &str) -> PathBuf {
        self.mount.join(file.split('.').next().unwrap_or_default()).join(relative).join(file)
    }

    /// The cgroup's directory in each hierarchy written to: the cpu controller's first on v1.
    fn dirs(&self, relative: &Path) -> Vec<PathBuf> {
        match self.version {
            Version::V1 => V1_CONTROLLERS
                .iter()
                .filter(|c| **c != "hugetlb" || self.has_hugetlb())
                .map(|c| self.mount.join(c).join(relative))
                .collect(),
            Version::V2 => vec![self.mount.join(relative)],
        }
    }

    /// On v2, makes `relative` level by level, each parent enabling the cpu, memory and pids
    /// controllers for its children. A controller the kernel refuses (not available, or
    /// processes in the parent) is left: the write of its file then says what is missing.
    fn make_handing_down_controllers(&self, relative: &Path) -> Result<(), PodCgroupError> {
        let mut dir = self.mount.clone();
        for component in relative.components() {
            let _ = write(&dir.join("cgroup.subtree_control"), V2_SUBTREE_CONTROL);
            if self.has_hugetlb() {
                let _ = write(&dir.join("cgroup.subtree_control"), "+hugetlb");
            }
            dir.push(component);
            match std::fs::create_dir(&dir) {
                Err(err) if err.kind() != io::ErrorKind::AlreadyExists => {
                    return Err(PodCgroupError::new("making", dir.display().to_string(), err));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The files and values `config` sets, in the order they are written (the period before
    /// the quota, as runc does).
    fn files(&self, config: &ResourceConfig) -> Vec<(String, String)> {
        let mut files = Vec::new();
        match self.version {
            Version::V1 => {
                if let Some(shares) = config.cpu_shares {
                    files.push(("cpu.shares".to_owned(), shares.to_string()));
                }
                if let Some(period) = config.cpu_period {
                    files.push(("cpu.cfs_period_us".to_owned(), period.to_string()));
                }
                if let Some(quota) = config.cpu_quota.filter(|q| *q != 0) {
                    files.push(("cpu.cfs_quota_us".to_owned(), quota.to_string()));
                }
                if let Some(limit) = config.memory_limit.filter(|l| *l > 0) {
                    files.push(("memory.limit_in_bytes".to_owned(), limit.to_string()));
                }
            }
            Version::V2 => {
                if let Some(shares) = config.cpu_shares {
                    files.push(("cpu.weight".to_owned(), shares_to_weight(shares).to_string()));
                }
                if let Some(quota) = config.cpu_quota.filter(|q| *q != 0) {
                    let quota = if quota < 0 { "max".to_owned() } else { quota.to_string() };
                    let period = config.cpu_period.unwrap_or(crate::resource_config::DEFAULT_CPU_PERIOD);
                    files.push(("cpu.max".to_owned(), format!("{quota} {period}")));
                }
                if let Some(limit) = config.memory_limit.filter(|l| *l > 0) {
                    files.push(("memory.max".to_owned(), limit.to_string()));
                }
            }
        }
        if let Some(pids) = config.pids_limit {
            files.push(("pids.max".to_owned(), pids.to_string()));
        }
        if self.has_hugetlb() {
            let suffix = match self.version {
                Version::V1 => "limit_in_bytes",
                Version::V2 => "max",
            };
            for (size, limit) in &config.hugepage_limits {
                files.push((format!("hugetlb.{size}.{suffix}"), limit.to_string()));
            }
        }
        files
    }

    /// Whether the kernel has the hugetlb controller here (upstream writes huge page limits
    /// only then).
    fn has_hugetlb(&self) -> bool {
        match self.version {
            Version::V1 => self.mount.join("hugetlb").is_dir(),
            Version::V2 => std::fs::read_to_string(self.mount.join("cgroup.controllers"))
                .is_ok_and(|c| c.split_whitespace().any(|c| c == "hugetlb")),
        }
    }
}

/// Writes `value` to an existing cgroup file (created only outside a cgroupfs, as in tests).
fn write(path: &Path, value: &str) -> io::Result<()> {
    let mut file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).open(path)?;
    file.write_all(value.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(path: PathBuf) -> String {
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    fn guaranteed() -> ResourceConfig {
        ResourceConfig {
            cpu_shares: Some(512),
            cpu_quota: Some(50_000),
            cpu_period: Some(100_000),
            memory_limit: Some(64 << 20),
            pids_limit: Some(100),
            hugepage_limits: vec![("2MB".to_owned(), 4 << 20), ("1GB".to_owned(), 0)],
        }
    }

    #[test]
    fn a_reserved_cgroup_must_exist_in_every_mounted_controller_and_gets_only_its_reservation() {
        let mount = tempfile::tempdir().unwrap();
        let fs = Cgroupfs::new(mount.path(), Version::V1);
        for controller in ["cpu", "memory", "pids"] {
            std::fs::create_dir(mount.path().join(controller)).unwrap();
        }
        let reservation = ResourceConfig::for_reservation(Some(500), Some(100 << 20));
        std::fs::create_dir_all(mount.path().join("cpu/system.slice")).unwrap();
        let err = fs.update_existing("/system.slice", &reservation).unwrap_err();
        let missing = format!(
            "cgroup \"/system.slice\" has some missing paths: {}, {}",
            mount.path().join("memory/system.slice").display(),
            mount.path().join("pids/system.slice").display()
        );
        assert_eq!(err.source.to_string(), missing);
        assert!(!mount.path().join("memory/system.slice").exists(), "nothing is made");
        for controller in ["memory", "pids"] {
            std::fs::create_dir(mount.path().join(controller).join("system.slice")).unwrap();
        }
        fs.update_existing("/system.slice", &reservation).unwrap();
        assert_eq!(read(mount.path().join("cpu/system.slice/cpu.shares")), "512");
        assert_eq!(read(mount.path().join("memory/system.slice/memory.limit_in_bytes")), "104857600");
        assert!(!mount.path().join("cpu/system.slice/cpu.cfs_quota_us").exists());
        assert!(!mount.path().join("pids/system.slice/pids.max").exists());
        // Nothing reserved: the cgroup must exist all the same.
        let err = fs.update_existing("/kube.slice", &ResourceConfig::default()).unwrap_err();
        assert!(err.source.to_string().contains("missing paths"), "{err}");
    }

    #[test]
    fn a_v2_reserved_cgroup_needs_the_roots_controllers() {
        let mount = tempfile::tempdir().unwrap();
        std::fs::write(mount.path().join("cgroup.controllers"), "cpuset cpu io memory pids").unwrap();
        let fs = Cgroupfs::new(mount.path(), Version::V2);
        let reservation = ResourceConfig::for_reservation(Some(1000), None);
        let err = fs.update_existing("/system.slice", &reservation).unwrap_err();
        assert!(err.source.to_string().ends_with("some missing controllers: cpu, cpuset, memory, pids"), "{err}");
        std::fs::create_dir(mount.path().join("system.slice")).unwrap();
        std::fs::write(mount.path().join("system.slice/cgroup.controllers"), "cpu memory pids").unwrap();
        let err = fs.update_existing("/system.slice", &reservation).unwrap_err();
        assert!(err.source.to_string().ends_with("some missing controllers: cpuset"), "{err}");
        std::fs::write(mount.path().join("system.slice/cgroup.controllers"), "cpuset cpu memory pids").unwrap();
        fs.update_existing("/system.slice", &reservation).unwrap();
        assert_eq!(read(mount.path().join("system.slice/cpu.weight")), "39");
    }

    #[test]
    fn v1_writes_each_controllers_files() {
        let mount = tempfile::tempdir().unwrap();
        let fs = Cgroupfs::new(mount.path(), Version::V1);
        assert!(!fs.exists("/kubepods/podu1"));
        fs.apply("/kubepods/podu1", &guaranteed()).unwrap();
        assert!(fs.exists("/kubepods/podu1"));
        let dir = |c: &str| mount.path().join(c).join("kubepods/podu1");
        assert_eq!(read(dir("cpu").join("cpu.shares")), "512");
        assert_eq!(read(dir("cpu").join("cpu.cfs_period_us")), "100000");
        assert_eq!(read(dir("cpu").join("cpu.cfs_quota_us")), "50000");
        assert_eq!(read(dir("memory").join("memory.limit_in_bytes")), "67108864");
        assert_eq!(read(dir("pids").join("pids.max")), "100");
        assert!(!dir("hugetlb").exists(), "no hugetlb controller, no huge page limits");
        // With the hugetlb controller: a limit for each size.
        std::fs::create_dir(mount.path().join("hugetlb")).unwrap();
        fs.apply("/kubepods/podu1", &guaranteed()).unwrap();
        assert_eq!(read(dir("hugetlb").join("hugetlb.2MB.limit_in_bytes")), "4194304");
        assert_eq!(read(dir("hugetlb").join("hugetlb.1GB.limit_in_bytes")), "0");
        // A BestEffort pod: only its shares.
        fs.apply("/kubepods/besteffort/podu2", &ResourceConfig::for_best_effort()).unwrap();
        let best_effort = mount.path().join("cpu/kubepods/besteffort/podu2");
        assert_eq!(read(best_effort.join("cpu.shares")), "2");
        assert!(!best_effort.join("cpu.cfs_quota_us").exists());
        assert!(!mount.path().join("memory/kubepods/besteffort/podu2/memory.limit_in_bytes").exists());
    }

    #[test]
    fn v2_writes_weight_max_and_hands_controllers_down() {
        let mount = tempfile::tempdir().unwrap();
        let fs = Cgroupfs::new(mount.path(), Version::V2);
        fs.apply("/kubepods/burstable/podu1", &guaranteed()).unwrap();
        let dir = mount.path().join("kubepods/burstable/podu1");
        assert_eq!(read(dir.join("cpu.weight")), "20");
        assert_eq!(read(dir.join("cpu.max")), "50000 100000");
        assert_eq!(read(dir.join("memory.max")), "67108864");
        assert_eq!(read(dir.join("pids.max")), "100");
        for parent in ["", "kubepods", "kubepods/burstable"] {
            assert_eq!(read(mount.path().join(parent).join("cgroup.subtree_control")), "+cpu +memory +pids");
        }
        assert!(!dir.join("cgroup.subtree_control").exists(), "the pod's own children are the runtime's");
        assert!(!dir.join("hugetlb.2MB.max").exists(), "the root has no hugetlb controller");
        std::fs::write(mount.path().join("cgroup.controllers"), "cpu memory pids hugetlb").unwrap();
        fs.apply("/kubepods/burstable/podu1", &guaranteed()).unwrap();
        assert_eq!(read(dir.join("hugetlb.2MB.max")), "4194304");
        assert_eq!(read(dir.join("hugetlb.1GB.max")), "0");
        assert_eq!(read(mount.path().join("kubepods/cgroup.subtree_control")), "+hugetlb", "handed down too");
        let unlimited = ResourceConfig { cpu_quota: Some(-1), cpu_period: Some(100_000), ..ResourceConfig::default() };
        fs.apply("/kubepods/podu2", &unlimited).unwrap();
        assert_eq!(read(mount.path().join("kubepods/podu2/cpu.max")), "max 100000");
    }

    #[test]
    fn names_that_leave_the_hierarchy_are_refused() {
        let mount = tempfile::tempdir().unwrap();
        let fs = Cgroupfs::new(mount.path(), Version::V1);
        for bad in ["kubepods/pod1", "/kubepods/../../etc", "/", ""] {
            assert!(fs.apply(bad, &guaranteed()).is_err(), "{bad}");
            assert!(!fs.exists(bad), "{bad}");
        }
    }
}
