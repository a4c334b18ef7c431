//! Who a request comes from, as upstream's kubelet authenticates it (`BuildAuthn`): its client
//! certificate (already verified against `clientCAFile` by the TLS handshake), else its bearer
//! token through a TokenReview (from the `Authorization` header, or a WebSocket subprotocol),
//! else `system:anonymous` when anonymous requests are enabled.
//!
//! As upstream's union, the first authenticator that knows the caller wins, and a failure of any
//! other (a token the API server rejects among them) is a 401, never anonymous. The credential
//! that authenticated a request is taken off it, so no handler or runtime sees the token.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use async_trait::async_trait;
use base64::Engine;
use http::{HeaderMap, HeaderValue, header};
use ring::hmac;
use rustls::pki_types::CertificateDer;

use crate::cache::TtlCache;

/// The group every authenticated user is in.
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";
/// The anonymous user's name.
pub const ANONYMOUS_USER: &str = "system:anonymous";
/// The anonymous user's group.
pub const UNAUTHENTICATED_GROUP: &str = "system:unauthenticated";

/// A caller of the kubelet API.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub struct User {
    /// The user name (a certificate's common name, a token's user).
    pub name: String,
    /// The user's UID, when the token review gave one.
    pub uid: String,
    /// The groups (a certificate's organizations).
    pub groups: Vec<String>,
    /// Extra attributes from the token review.
    pub extra: BTreeMap<String, Vec<String>>,
}

impl User {
    /// A user named `name` in `groups`.
    pub fn new(name: impl Into<String>, groups: impl IntoIterator<Item = impl Into<String>>) -> Self {
        User { name: name.into(), groups: groups.into_iter().map(Into::into).collect(), ..User::default() }
    }
}

/// A request could not be authenticated (upstream answers 401 either way).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The client certificate could not be read.
    #[error("cannot read the client certificate: {0}")]
    Certificate(String),
    /// The API server does not authenticate the bearer token.
    #[error("invalid bearer token")]
    InvalidBearerToken,
    /// A WebSocket subprotocol token that cannot be used.
    #[error("{0}")]
    WebSocketToken(&'static str),
    /// The token review failed (the API server did not answer, or said why not).
    #[error("token review failed")]
    TokenReview(#[source] ReviewError),
}

/// A TokenReview or SubjectAccessReview that got no answer.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ReviewError(pub String);

/// Checks a bearer token with the API server (a TokenReview).
#[async_trait]
pub trait TokenReviewer: Send + Sync {
    /// The token's user, or `None` when the API server does not authenticate it.
    async fn review(&self, token: &str) -> Result<Option<User>, ReviewError>;
}

/// The authentication chain of the kubelet API.
pub struct Authenticator {
    tokens: Option<CachedTokens>,
    anonymous: bool,
}

/// Token answers kept by a keyed digest of the token (upstream's cached token authenticator),
/// so that the cache never holds a token and a long one costs no more than a short one.
struct CachedTokens {
    reviewer: Arc<dyn TokenReviewer>,
    answers: TtlCache<TokenDigest, Option<User>>,
    /// Made at start; `None` when no random key could be made, and then nothing is kept.
    key: Option<hmac::Key>,
    ttl: Duration,
}

/// The HMAC-SHA256 of a token.
type TokenDigest = [u8; 32];

impl Authenticator {
    /// Client certificates always authenticate (the TLS layer only accepts those `clientCAFile`
    /// signed); bearer tokens when a `reviewer` is given, with its answers kept for `ttl`; and
    /// `anonymous` turns on `system:anonymous` for the rest.
    pub fn new(tokens: Option<(Arc<dyn TokenReviewer>, Duration)>, anonymous: bool) -> Self {
        let tokens = tokens.map(|(reviewer, ttl)| {
            let key = hmac::Key::generate(hmac::HMAC_SHA256, &ring::rand::SystemRandom::new()).ok();
            if key.is_none() {
                tracing::warn!("no random key for the token cache: every bearer token is reviewed");
            }
            CachedTokens { reviewer, answers: TtlCache::new(TOKEN_CACHE_SIZE), key, ttl }
        });
        Authenticator { tokens, anonymous }
    }

    /// The caller of a request with the verified `client_certificate` (the leaf) and `headers`;
    /// `Ok(None)` is unauthenticated (401). The bearer token that authenticated the caller is
    /// taken off `headers`.
    pub async fn authenticate(
        &self,
        client_certificate: Option<&CertificateDer<'_>>,
        headers: &mut HeaderMap,
    ) -> Result<Option<User>, Error> {
        let mut failure = None;
        if let Some(certificate) = client_certificate {
            match user_of_certificate(certificate) {
                Ok(Some(user)) => return Ok(Some(authenticated(user))),
                Ok(None) => {}
                Err(e) => failure = Some(e),
            }
        }
        if let Some(tokens) = &self.tokens {
            match tokens.user_of_bearer_header(headers).await {
                Ok(Some(user)) => return Ok(Some(authenticated(user))),
                Ok(None) => {}
                Err(e) => failure = Some(e),
            }
            match tokens.user_of_websocket_protocol(headers).await {
                Ok(Some(user)) => return Ok(Some(authenticated(user))),
                Ok(None) => {}
                Err(e) => failure = Some(e),
            }
        }
        match failure {
            Some(error) => Err(error),
            None if self.anonymous => Ok(Some(User::new(ANONYMOUS_USER, [UNAUTHENTICATED_GROUP]))),
            None => Ok(None),
        }
    }
}

/// How many token answers are kept (upstream's token cache holds 4096 per stripe).
const TOKEN_CACHE_SIZE: usize = 4096;

/// The subprotocol prefix of a bearer token in `Sec-WebSocket-Protocol`.
const WEBSOCKET_TOKEN_PREFIX: &str = "base64url.bearer.authorization.k8s.io.";

impl CachedTokens {
    /// The user of `Authorization: Bearer <token>` (upstream's `bearertoken` authenticator);
    /// the header goes once it authenticated.
    async fn user_of_bearer_header(&self, headers: &mut HeaderMap) -> Result<Option<User>, Error> {
        let Some(token) = headers.get(header::AUTHORIZATION).and_then(bearer_token) else { return Ok(None) };
        let user = self.user_of(&token).await?;
        headers.remove(header::AUTHORIZATION);
        Ok(Some(user))
    }

    /// The user of a `base64url.bearer.authorization.k8s.io.<token>` subprotocol of a WebSocket
    /// request (upstream's `websocket` protocol authenticator); once it authenticated, the
    /// other subprotocols stay for the handler to choose from.
    async fn user_of_websocket_protocol(&self, headers: &mut HeaderMap) -> Result<Option<User>, Error> {
        if !is_websocket_request(headers) {
            return Ok(None);
        }
        let Some((token, others)) = websocket_token(headers)? else { return Ok(None) };
        let user = self.user_of(&token).await?;
        headers.remove(header::SEC_WEBSOCKET_PROTOCOL);
        if let Ok(value) = HeaderValue::from_str(&others.join(",")) {
            headers.insert(header::SEC_WEBSOCKET_PROTOCOL, value);
        }
        Ok(Some(user))
    }

    /// The user of `token`, from the cache or a review; a token the API server does not
    /// authenticate is an error, as upstream's.
    async fn user_of(&self, token: &str) -> Result<User, Error> {
        let digest = self.key.as_ref().map(|key| digest_of(key, token));
        let cached = digest.as_ref().and_then(|digest| self.answers.get(digest));
        let answer = match cached {
            Some(answer) => answer,
            None => {
                let answer = self.reviewer.review(token).await.map_err(Error::TokenReview)?;
                if let Some(digest) = digest {
                    self.answers.insert(digest, answer.clone(), self.ttl);
                }
                answer
            }
        };
        answer.ok_or(Error::InvalidBearerToken)
    }
}

/// The cache key of `token`.
fn digest_of(key: &hmac::Key, token: &str) -> TokenDigest {
    let mut digest = [0u8; 32];
    digest.copy_from_slice(hmac::sign(key, token.as_bytes()).as_ref());
    digest
}

/// The token of `Authorization: Bearer <token>` as upstream reads it: the header trimmed and
/// split on single spaces, the scheme in any case, the token its second part; `None` for another
/// scheme, no token, or an empty one (two spaces).
fn bearer_token(header: &HeaderValue) -> Option<String> {
    let header = header.to_str().ok()?.trim();
    let mut parts = header.splitn(3, ' ');
    let scheme = parts.next()?;
    let token = parts.next()?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then(|| token.to_owned())
}

/// Whether the request asks to upgrade to a WebSocket (upstream's `IsWebSocketRequest`).
fn is_websocket_request(headers: &HeaderMap) -> bool {
    let connection_upgrade = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case("upgrade"));
    let websocket =
        headers.get(header::UPGRADE).and_then(|v| v.to_str().ok()).is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    connection_upgrade && websocket
}

/// The bearer token among the WebSocket subprotocols, and the other subprotocols; `None` when no
/// subprotocol carries a token. Two tokens, a token that is not base64url of UTF-8, or a token
/// with no other subprotocol to answer with are errors, as upstream's.
fn websocket_token(headers: &HeaderMap) -> Result<Option<(String, Vec<String>)>, Error> {
    let mut token = None;
    let mut others = Vec::new();
    let protocols = headers.get_all(header::SEC_WEBSOCKET_PROTOCOL).iter().filter_map(|v| v.to_str().ok());
    for protocol in protocols.flat_map(|v| v.split(',')).map(str::trim) {
        let Some(encoded) = protocol.strip_prefix(WEBSOCKET_TOKEN_PREFIX) else {
            others.push(protocol.to_owned());
            continue;
        };
        if token.is_some() {
            return Err(Error::WebSocketToken("multiple base64.bearer.authorization tokens specified"));
        }
        let decoded = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(encoded)
            .map_err(|_| Error::WebSocketToken("invalid base64.bearer.authorization token encoding"))?;
        let text = String::from_utf8(decoded)
            .map_err(|_| Error::WebSocketToken("invalid base64.bearer.authorization token"))?;
        token = Some(text);
    }
    match token.filter(|t| !t.is_empty()) {
        None => Ok(None),
        Some(_) if others.is_empty() => Err(Error::WebSocketToken("missing additional subprotocol")),
        Some(token) => Ok(Some((token, others))),
    }
}

/// Adds `system:authenticated`, as upstream's `AuthenticatedGroupAdder`.
fn authenticated(mut user: User) -> User {
    if !user.groups.iter().any(|g| g == AUTHENTICATED_GROUP) {
        user.groups.push(AUTHENTICATED_GROUP.to_owned());
    }
    user
}

/// The user of a client certificate: its common name, its organizations as groups; `None`
/// without a common name (upstream's `CommonNameUserConversion`).
pub fn user_of_certificate(certificate: &CertificateDer<'_>) -> Result<Option<User>, Error> {
    let (_, parsed) =
        x509_parser::parse_x509_certificate(certificate.as_ref()).map_err(|e| Error::Certificate(e.to_string()))?;
    let subject = parsed.subject();
    let text = |attribute: &x509_parser::x509::AttributeTypeAndValue<'_>| {
        attribute.as_str().map(str::to_owned).map_err(|e| Error::Certificate(e.to_string()))
    };
    let Some(common_name) = subject.iter_common_name().next() else { return Ok(None) };
    let name = text(common_name)?;
    if name.is_empty() {
        return Ok(None);
    }
    let groups = subject.iter_organization().map(text).collect::<Result<Vec<_>, _>>()?;
    Ok(Some(User::new(name, groups)))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    struct Reviewer(AtomicUsize);

    #[async_trait]
    impl TokenReviewer for Reviewer {
        async fn review(&self, token: &str) -> Result<Option<User>, ReviewError> {
            self.0.fetch_add(1, Ordering::SeqCst);
            match token {
                "good" => Ok(Some(User::new("jane", ["dev"]))),
                "down" => Err(ReviewError("connection refused".to_owned())),
                _ => Ok(None),
            }
        }
    }

    fn certificate(subject: &str, organizations: &[&str]) -> CertificateDer<'static> {
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        if !subject.is_empty() {
            params.distinguished_name.push(rcgen::DnType::CommonName, subject);
        }
        for organization in organizations {
            params.distinguished_name.push(rcgen::DnType::OrganizationName, *organization);
        }
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().clone()
    }

    /// Headers with `Authorization: authorization`.
    fn bearer(authorization: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_str(authorization).unwrap());
        headers
    }

    /// The user of a request with `authorization` and no certificate.
    async fn user_of(chain: &Authenticator, authorization: &str) -> Result<Option<User>, Error> {
        chain.authenticate(None, &mut bearer(authorization)).await
    }

    #[tokio::test]
    async fn certificates_then_tokens_then_anonymous_as_upstream_chains_them() {
        let reviewer = Arc::new(Reviewer(AtomicUsize::new(0)));
        let chain = Authenticator::new(Some((reviewer.clone(), Duration::from_secs(120))), false);
        let master = certificate("kube-apiserver-kubelet-client", &["system:masters"]);
        let user = chain.authenticate(Some(&master), &mut bearer("Bearer good")).await.unwrap().unwrap();
        assert_eq!(user.name, "kube-apiserver-kubelet-client");
        assert_eq!(user.groups, ["system:masters", AUTHENTICATED_GROUP], "the certificate wins over the token");
        assert_eq!(reviewer.0.load(Ordering::SeqCst), 0);

        let mut headers = bearer("Bearer good");
        let user = chain.authenticate(None, &mut headers).await.unwrap().unwrap();
        assert_eq!(
            (user.name.as_str(), user.groups.as_slice()),
            ("jane", &["dev".to_owned(), AUTHENTICATED_GROUP.to_owned()][..])
        );
        assert!(headers.get(header::AUTHORIZATION).is_none(), "the token that authenticated is taken off");
        user_of(&chain, "bearer good").await.unwrap().unwrap();
        assert_eq!(reviewer.0.load(Ordering::SeqCst), 1, "the answer is cached");

        assert!(matches!(user_of(&chain, "Bearer bad").await, Err(Error::InvalidBearerToken)), "401");
        user_of(&chain, "Bearer bad").await.unwrap_err();
        assert_eq!(reviewer.0.load(Ordering::SeqCst), 2, "a rejection is cached too");
        assert!(user_of(&chain, "Basic amFuZTpwdw==").await.unwrap().is_none());
        assert!(chain.authenticate(None, &mut HeaderMap::new()).await.unwrap().is_none(), "anonymous is off");
        assert!(matches!(user_of(&chain, "Bearer down").await, Err(Error::TokenReview(_))));
        user_of(&chain, "Bearer down").await.unwrap_err();
        assert_eq!(reviewer.0.load(Ordering::SeqCst), 4, "a failed review is asked again, never cached");

        let nameless = certificate("", &["system:masters"]);
        let user = chain.authenticate(Some(&nameless), &mut HeaderMap::new()).await.unwrap();
        assert!(user.is_none(), "no common name, no user");
    }

    #[tokio::test]
    async fn a_bearer_header_is_read_as_upstream_splits_it() {
        let reviewer = Arc::new(Reviewer(AtomicUsize::new(0)));
        let chain = Authenticator::new(Some((reviewer.clone(), Duration::from_secs(120))), true);
        for (header, user) in [
            // No token at all: the request has no credentials, so it is anonymous.
            ("Bearer", ANONYMOUS_USER),
            ("Bearer ", ANONYMOUS_USER),
            ("  Bearer   ", ANONYMOUS_USER),
            // Two spaces: an empty second part, no token.
            ("Bearer  good", ANONYMOUS_USER),
            ("BEARER good", "jane"),
            (" Bearer good ", "jane"),
            // The token is the second part; what follows another space is not read.
            ("Bearer good trailing words", "jane"),
        ] {
            let answer = user_of(&chain, header).await.unwrap().unwrap();
            assert_eq!(answer.name, user, "{header:?}");
        }
        assert_eq!(reviewer.0.load(Ordering::SeqCst), 1, "only `good` was reviewed, then kept");
    }

    #[tokio::test]
    async fn anonymous_gets_the_rest_but_never_a_failure_or_a_rejected_token() {
        let reviewer = Arc::new(Reviewer(AtomicUsize::new(0)));
        let chain = Authenticator::new(Some((reviewer, Duration::from_secs(120))), true);
        let anonymous = chain.authenticate(None, &mut HeaderMap::new()).await.unwrap().unwrap();
        assert_eq!(anonymous, User::new(ANONYMOUS_USER, [UNAUTHENTICATED_GROUP]));
        assert!(matches!(user_of(&chain, "Bearer bad").await, Err(Error::InvalidBearerToken)), "401, not anonymous");
        assert!(user_of(&chain, "Bearer down").await.is_err(), "an error is 401, not anonymous");
        let without_webhook = Authenticator::new(None, false);
        assert!(user_of(&without_webhook, "Bearer good").await.unwrap().is_none(), "tokens are not read");
    }

    /// Headers of a WebSocket upgrade offering `protocols`.
    fn websocket(protocols: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, Upgrade"));
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        headers.insert(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_str(protocols).unwrap());
        headers
    }

    #[tokio::test]
    async fn a_websocket_subprotocol_carries_a_bearer_token_as_upstreams_does() {
        let reviewer = Arc::new(Reviewer(AtomicUsize::new(0)));
        let chain = Authenticator::new(Some((reviewer.clone(), Duration::from_secs(120))), false);
        let token =
            |t: &str| format!("{WEBSOCKET_TOKEN_PREFIX}{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(t));
        let mut headers = websocket(&format!("v5.channel.k8s.io, {}", token("good")));
        let user = chain.authenticate(None, &mut headers).await.unwrap().unwrap();
        assert_eq!(user.name, "jane");
        assert_eq!(
            headers[header::SEC_WEBSOCKET_PROTOCOL],
            "v5.channel.k8s.io",
            "the token's subprotocol is taken off"
        );

        let refused = [
            (token("good"), "missing additional subprotocol"),
            (
                format!("v5.channel.k8s.io,{},{}", token("good"), token("good")),
                "multiple base64.bearer.authorization tokens specified",
            ),
            (
                format!("v5.channel.k8s.io,{WEBSOCKET_TOKEN_PREFIX}!!"),
                "invalid base64.bearer.authorization token encoding",
            ),
            (format!("v5.channel.k8s.io,{}", token("bad")), "invalid bearer token"),
        ];
        for (protocols, message) in refused {
            let error = chain.authenticate(None, &mut websocket(&protocols)).await.unwrap_err();
            assert_eq!(error.to_string(), message, "{protocols}");
        }
        let mut not_an_upgrade = websocket(&format!("v5.channel.k8s.io,{}", token("good")));
        not_an_upgrade.remove(header::UPGRADE);
        assert!(chain.authenticate(None, &mut not_an_upgrade).await.unwrap().is_none(), "only a WebSocket request");
    }

    #[tokio::test]
    async fn the_token_cache_holds_digests_not_tokens() {
        let reviewer = Arc::new(Reviewer(AtomicUsize::new(0)));
        let chain = Authenticator::new(Some((reviewer.clone(), Duration::from_secs(120))), false);
        let tokens = chain.tokens.as_ref().unwrap();
        let long_token = "x".repeat(400 * 1024);
        user_of(&chain, &format!("Bearer {long_token}")).await.unwrap_err();
        let key = tokens.key.as_ref().unwrap();
        let digest = digest_of(key, &long_token);
        assert_eq!(tokens.answers.get(&digest), Some(None), "the rejection is kept under the token's digest");
        assert_eq!(std::mem::size_of::<TokenDigest>(), 32, "whatever the token's length");
        let other = Authenticator::new(Some((reviewer, Duration::from_secs(120))), false);
        let other_key = other.tokens.as_ref().unwrap().key.as_ref().unwrap();
        assert_ne!(digest_of(other_key, &long_token), digest, "each agent keys its digests with its own key");
    }
}
