//! The node's credentials as its API clients use them, read again after a rotation without a
//! restart (upstream `pkg/kubelet/certificate/transport.go`, which swaps the client certificate
//! under a running client).
//!
//! A [`NodeCredentials`] names the kubeconfig and, with `rotateCertificates`, the current pair in
//! `--cert-dir` (`kubelet-client-current.pem`), which takes the place of the kubeconfig's own
//! client certificate once it exists, as upstream's certificate store does. A client made by
//! [`crate::heartbeat::connect_node`] sends each request through a kube-rs client built from
//! them; [`NodeCredentials::reload`] (called once a rotated certificate is stored) makes every
//! such client build its inner client again, so new requests go over new connections with the
//! new certificate, while requests already running (watches) end on their own connection.

use std::{
    future::Future,
    path::{Path, PathBuf},
    pin::Pin,
    sync::{
        Arc, PoisonError, RwLock,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use http::{Request, Response};
use kube::{
    Client,
    client::Body,
    config::{KubeConfigOptions, Kubeconfig},
};

use crate::heartbeat::Error;

/// Where the node's credentials are read from (see the [module](self)).
#[derive(Clone, Debug)]
pub struct NodeCredentials {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    kubeconfig: PathBuf,
    /// `<cert-dir>/kubelet-client-current.pem` with `rotateCertificates`.
    rotated_pair: Option<PathBuf>,
    /// Bumped by each [`NodeCredentials::reload`].
    generation: AtomicU64,
}

impl NodeCredentials {
    /// The credentials of `kubeconfig`, as they are.
    pub fn new(kubeconfig: &Path) -> NodeCredentials {
        NodeCredentials::with_pair(kubeconfig, None)
    }

    /// The credentials of `kubeconfig`, with the client certificate and key of `pair` (a PEM file
    /// holding both) in place of the kubeconfig's once that file exists.
    pub fn rotated(kubeconfig: &Path, pair: &Path) -> NodeCredentials {
        NodeCredentials::with_pair(kubeconfig, Some(pair.to_owned()))
    }

    fn with_pair(kubeconfig: &Path, rotated_pair: Option<PathBuf>) -> NodeCredentials {
        let inner = Inner { kubeconfig: kubeconfig.to_owned(), rotated_pair, generation: AtomicU64::new(0) };
        NodeCredentials { inner: Arc::new(inner) }
    }

    /// The kubeconfig.
    pub fn kubeconfig(&self) -> &Path {
        &self.inner.kubeconfig
    }

    /// The client certificate in use, as PEM: the rotated pair once it exists, else the
    /// kubeconfig's (its `client-certificate` file or its `client-certificate-data`); none when
    /// the kubeconfig has no certificate.
    pub fn certificate_pem(&self) -> Option<Vec<u8>> {
        if let Some(pair) = self.inner.rotated_pair.as_ref().filter(|pair| pair.exists()) {
            return std::fs::read(pair).ok();
        }
        let kubeconfig = Kubeconfig::read_from(&self.inner.kubeconfig).ok()?;
        let user = crate::bootstrap::current_user(&kubeconfig)?;
        if let Some(data) = &user.client_certificate_data {
            use base64::Engine;
            return base64::engine::general_purpose::STANDARD.decode(data).ok();
        }
        let path = user.client_certificate.as_deref()?;
        std::fs::read(self.inner.kubeconfig.parent().unwrap_or(Path::new("/")).join(path)).ok()
    }

    /// Makes every client of these credentials read them again before its next request.
    pub fn reload(&self) {
        self.inner.generation.fetch_add(1, Ordering::SeqCst);
    }

    fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::SeqCst)
    }

    /// The client configuration they give now, with kube's own retry off (the clients retry as
    /// client-go does, [`crate::retry`]) and `read_timeout`.
    pub(crate) async fn config(&self, read_timeout: Option<Duration>) -> Result<kube::Config, Error> {
        let path = &self.inner.kubeconfig;
        let error = |source: Box<dyn std::error::Error + Send + Sync>| Error::Kubeconfig {
            path: path.display().to_string(),
            source,
        };
        let mut kubeconfig = Kubeconfig::read_from(path).map_err(|e| error(e.into()))?;
        if let Some(pair) = self.inner.rotated_pair.as_ref().filter(|pair| pair.exists()) {
            use_pair(&mut kubeconfig, pair);
        }
        let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| error(e.into()))?;
        config.default_retry = false;
        if read_timeout.is_some() {
            config.read_timeout = read_timeout;
        }
        Ok(config)
    }
}

/// Puts `pair` in place of the client certificate and key of every user of `kubeconfig`.
fn use_pair(kubeconfig: &mut Kubeconfig, pair: &Path) {
    let pair = pair.display().to_string();
    for user in kubeconfig.auth_infos.iter_mut().filter_map(|named| named.auth_info.as_mut()) {
        user.client_certificate = Some(pair.clone());
        user.client_key = Some(pair.clone());
        user.client_certificate_data = None;
        user.client_key_data = None;
    }
}

/// A tower service that sends each request through a kube-rs client of the node's credentials,
/// built again after each [`NodeCredentials::reload`].
#[derive(Clone)]
pub(crate) struct ReloadingService {
    credentials: NodeCredentials,
    read_timeout: Option<Duration>,
    current: Arc<RwLock<(u64, Client)>>,
}

impl ReloadingService {
    /// The service, with its first client built now (so that a kubeconfig that cannot be used
    /// is an error at once), the default namespace, and the API server's label
    /// ([`crate::client_metrics::host_label`]).
    pub(crate) async fn new(
        credentials: NodeCredentials,
        read_timeout: Option<Duration>,
    ) -> Result<(ReloadingService, String, Arc<str>), Error> {
        let generation = credentials.generation();
        let config = credentials.config(read_timeout).await?;
        let namespace = config.default_namespace.clone();
        let host = crate::client_metrics::host_label(&config.cluster_url);
        let client = build(config, &credentials)?;
        let current = Arc::new(RwLock::new((generation, client)));
        Ok((ReloadingService { credentials, read_timeout, current }, namespace, host))
    }

    /// The client of the credentials' current generation.
    async fn client(&self) -> Result<Client, Error> {
        let wanted = self.credentials.generation();
        {
            let current = self.current.read().unwrap_or_else(PoisonError::into_inner);
            if current.0 == wanted {
                return Ok(current.1.clone());
            }
        }
        let client = build(self.credentials.config(self.read_timeout).await?, &self.credentials)?;
        tracing::info!(kubeconfig = %self.credentials.kubeconfig().display(), "the API client reads the rotated credentials");
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = (wanted, client.clone());
        Ok(client)
    }
}

fn build(config: kube::Config, credentials: &NodeCredentials) -> Result<Client, Error> {
    let path = credentials.kubeconfig().display().to_string();
    let builder =
        kube::client::ClientBuilder::try_from(config).map_err(|e| Error::Kubeconfig { path, source: Box::new(e) })?;
    Ok(builder.build())
}

impl tower::Service<Request<Body>> for ReloadingService {
    type Response = Response<Body>;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let service = self.clone();
        Box::pin(async move {
            let client = service.client().await?;
            Ok(client.send(request).await?)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rotated_pair_takes_the_place_of_the_kubeconfigs_certificate_once_it_exists() {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubelet.conf");
        std::fs::write(
            &kubeconfig,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:1'}\n\
             users:\n- name: u\n  user: {client-certificate: pki/node.crt, client-key: pki/node.key}\n\
             contexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n",
        )
        .unwrap();
        std::fs::create_dir(dir.path().join("pki")).unwrap();
        std::fs::write(dir.path().join("pki/node.crt"), "the kubeconfig's").unwrap();
        let pair = dir.path().join("kubelet-client-current.pem");
        let credentials = NodeCredentials::rotated(&kubeconfig, &pair);
        assert_eq!(credentials.certificate_pem().as_deref(), Some(&b"the kubeconfig's"[..]));
        std::fs::write(&pair, "the rotated pair").unwrap();
        assert_eq!(credentials.certificate_pem().as_deref(), Some(&b"the rotated pair"[..]));

        let mut read = Kubeconfig::read_from(&kubeconfig).unwrap();
        use_pair(&mut read, &pair);
        let user = crate::bootstrap::current_user(&read).unwrap();
        assert_eq!(user.client_certificate.as_deref(), pair.to_str());
        assert_eq!(user.client_key.as_deref(), pair.to_str());

        assert_eq!(credentials.generation(), 0);
        credentials.clone().reload();
        assert_eq!(credentials.generation(), 1, "clones share the generation");
    }
}
