//! The on-disk result cache, in libcni's layout and format.
//!
//! One file per attachment at `<dir>/results/<network>-<container ID>-<ifname>`, holding the
//! network configuration ADD used (base64, as libcni writes `[]byte`), the runtime arguments and
//! the result. DEL and CHECK read it after a restart; files are replaced atomically.

use std::{
    io,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{Error, RuntimeConf};

/// The `kind` libcni writes in its cache files.
pub const CACHE_KIND: &str = "cniCacheV1";

/// The default cache directory, as libcni's.
pub const DEFAULT_DIR: &str = "/var/lib/cni";

/// One cached attachment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct CacheEntry {
    /// Always [`CACHE_KIND`].
    pub kind: String,
    /// The container ID.
    pub container_id: String,
    /// The network configuration (list) ADD ran with.
    #[serde(with = "base64_bytes")]
    pub config: Vec<u8>,
    /// The interface name.
    pub if_name: String,
    /// The network name.
    pub network_name: String,
    /// The network namespace path.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub netns: String,
    /// `CNI_ARGS` as pairs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cni_args: Vec<[String; 2]>,
    /// The capability arguments.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub capability_args: Map<String, Value>,
    /// The result of ADD, in the version ADD used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
}

impl CacheEntry {
    /// The runtime configuration the attachment was made with.
    pub fn runtime_conf(&self) -> RuntimeConf {
        let mut rt = RuntimeConf::new(&self.container_id, &self.netns, &self.if_name);
        rt.args = self.cni_args.iter().map(|[k, v]| (k.clone(), v.clone())).collect();
        rt.capability_args = self.capability_args.clone();
        rt
    }
}

mod base64_bytes {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(deserializer)?;
        base64::engine::general_purpose::STANDARD.decode(text).map_err(serde::de::Error::custom)
    }
}

/// The result cache directory.
#[derive(Debug, Clone)]
pub struct Cache {
    dir: PathBuf,
}

impl Default for Cache {
    fn default() -> Self {
        Cache::new(DEFAULT_DIR)
    }
}

impl Cache {
    /// A cache under `dir` (files go to `dir/results`).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Cache { dir: dir.into() }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file of one attachment.
    pub fn path(&self, network: &str, container_id: &str, ifname: &str) -> PathBuf {
        self.dir.join("results").join(format!("{network}-{container_id}-{ifname}"))
    }

    /// Stores an attachment, replacing any earlier one atomically.
    pub async fn put(&self, entry: &CacheEntry) -> Result<(), Error> {
        let path = self.path(&entry.network_name, &entry.container_id, &entry.if_name);
        let bytes = serde_json::to_vec(entry).map_err(|e| cache_error(&path, e))?;
        let results = self.dir.join("results");
        let tmp = results.join(format!(
            ".{}.tmp{}",
            path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default(),
            std::process::id()
        ));
        // One blocking task for the whole write: mkdir, write, rename.
        let target = path.clone();
        let write = move || -> io::Result<()> {
            use std::{
                fs,
                io::Write as _,
                os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _},
            };
            fs::DirBuilder::new().recursive(true).mode(0o700).create(&results)?;
            let mut file = fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
            // No fsync, as libcni: the rename makes the replacement atomic, and the cache is
            // advisory (DEL works without it); an fsync would double the cost of ADD.
            let written = file.write_all(&bytes).and_then(|()| fs::rename(&tmp, &target));
            if written.is_err() {
                let _ = fs::remove_file(&tmp);
            }
            written
        };
        match tokio::task::spawn_blocking(write).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(cache_error(&path, e)),
            Err(e) => return Err(cache_error(&path, e)),
        }
        Ok(())
    }

    /// The attachment of `network`/`container_id`/`ifname`, if cached.
    ///
    /// A file that cannot be decoded is an error naming it.
    pub async fn get(&self, network: &str, container_id: &str, ifname: &str) -> Result<Option<CacheEntry>, Error> {
        let path = self.path(network, container_id, ifname);
        match tokio::fs::read(&path).await {
            Ok(bytes) => decode(&path, &bytes).map(Some),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(cache_error(&path, e)),
        }
    }

    /// Forgets an attachment; forgetting one that is not cached is fine.
    pub async fn remove(&self, network: &str, container_id: &str, ifname: &str) -> Result<(), Error> {
        let path = self.path(network, container_id, ifname);
        match tokio::fs::remove_file(&path).await {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(cache_error(&path, e)),
            _ => Ok(()),
        }
    }

    /// Every cached attachment, of one container when `container_id` is given, in file order.
    /// Files that are not cache entries are skipped.
    pub async fn attachments(&self, container_id: Option<&str>) -> Result<Vec<CacheEntry>, Error> {
        let results = self.dir.join("results");
        let mut dir = match tokio::fs::read_dir(&results).await {
            Ok(dir) => dir,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(cache_error(&results, e)),
        };
        let mut names = Vec::new();
        while let Some(entry) = dir.next_entry().await.map_err(|e| cache_error(&results, e))? {
            names.push(entry.path());
        }
        names.sort();
        let mut found = Vec::new();
        for path in names {
            let Ok(bytes) = tokio::fs::read(&path).await else { continue };
            let Ok(entry) = decode(&path, &bytes) else { continue };
            if entry.if_name.is_empty() || entry.network_name.is_empty() {
                continue;
            }
            if container_id.is_none_or(|id| id == entry.container_id) {
                found.push(entry);
            }
        }
        Ok(found)
    }

    /// A new entry for an attachment made by ADD.
    pub(crate) fn entry(network: &str, config: &[u8], rt: &RuntimeConf, result: Value) -> CacheEntry {
        CacheEntry {
            kind: CACHE_KIND.to_owned(),
            container_id: rt.container_id.clone(),
            config: config.to_vec(),
            if_name: rt.ifname.clone(),
            network_name: network.to_owned(),
            netns: rt.netns.clone(),
            cni_args: rt.args.iter().map(|(k, v)| [k.clone(), v.clone()]).collect(),
            capability_args: rt.capability_args.clone(),
            result: Some(result),
        }
    }
}

fn decode(path: &Path, bytes: &[u8]) -> Result<CacheEntry, Error> {
    let entry: CacheEntry = serde_json::from_slice(bytes).map_err(|e| cache_error(path, e))?;
    if entry.kind != CACHE_KIND {
        return Err(cache_error(path, format!("unknown kind {:?}", entry.kind)));
    }
    Ok(entry)
}

fn cache_error(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Cache { path: path.to_owned(), message: e.to_string() }
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;
    use serde_json::json;

    use super::*;

    fn rt() -> RuntimeConf {
        let mut rt = RuntimeConf::new("c1", "/var/run/netns/x", "eth0");
        rt.args = vec![("K".into(), "V".into())];
        rt.capability_args.insert("portMappings".into(), json!([{"hostPort":8080,"containerPort":80}]));
        rt
    }

    #[tokio::test]
    async fn put_get_remove_in_libcni_layout() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::new(dir.path());
        let config = br#"{"cniVersion":"1.0.0","name":"net","plugins":[{"type":"bridge"}]}"#;
        let entry = Cache::entry("net", config, &rt(), json!({"cniVersion":"1.0.0"}));
        cache.put(&entry).await.unwrap();

        let path = dir.path().join("results/net-c1-eth0");
        let on_disk: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(on_disk["kind"], "cniCacheV1");
        assert_eq!(on_disk["containerId"], "c1");
        assert_eq!(on_disk["ifName"], "eth0");
        assert_eq!(on_disk["networkName"], "net");
        assert_eq!(on_disk["config"], base64::engine::general_purpose::STANDARD.encode(config));
        assert_eq!(on_disk["cniArgs"], json!([["K", "V"]]));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);

        let read = cache.get("net", "c1", "eth0").await.unwrap().unwrap();
        assert_eq!(read, entry);
        assert_eq!(read.runtime_conf(), rt());
        assert_eq!(cache.attachments(Some("c1")).await.unwrap(), std::slice::from_ref(&entry));
        assert!(cache.attachments(Some("c2")).await.unwrap().is_empty());

        cache.remove("net", "c1", "eth0").await.unwrap();
        cache.remove("net", "c1", "eth0").await.unwrap();
        assert_eq!(cache.get("net", "c1", "eth0").await.unwrap(), None);
        let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("results")).unwrap().collect();
        assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
    }

    #[tokio::test]
    async fn corrupt_files_are_errors_naming_the_file_and_skipped_in_listings() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::new(dir.path());
        std::fs::create_dir_all(dir.path().join("results")).unwrap();
        std::fs::write(dir.path().join("results/net-c1-eth0"), "{truncated").unwrap();
        std::fs::write(dir.path().join("results/net-c2-eth0"), r#"{"kind":"other"}"#).unwrap();
        let e = cache.get("net", "c1", "eth0").await.unwrap_err().to_string();
        assert!(e.contains("net-c1-eth0"), "{e}");
        assert!(cache.attachments(None).await.unwrap().is_empty());
    }
}
