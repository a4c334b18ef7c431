//! Who a request comes from, as upstream's kubelet authenticates it (`BuildAuthn`): its client
//! certificate (already verified against `clientCAFile` by the TLS handshake), else its bearer
//! token through a TokenReview, else `system:anonymous` when anonymous requests are enabled.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use async_trait::async_trait;
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
    /// The `Authorization` header is not a usable bearer token.
    #[error("invalid bearer token")]
    InvalidBearerToken,
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

struct CachedTokens {
    reviewer: Arc<dyn TokenReviewer>,
    answers: TtlCache<String, Option<User>>,
    ttl: Duration,
}

impl Authenticator {
    /// Client certificates always authenticate (the TLS layer only accepts those `clientCAFile`
    /// signed); bearer tokens when a `reviewer` is given, with its answers kept for `ttl`; and
    /// `anonymous` turns on `system:anonymous` for the rest.
    pub fn new(tokens: Option<(Arc<dyn TokenReviewer>, Duration)>, anonymous: bool) -> Self {
        let tokens =
            tokens.map(|(reviewer, ttl)| CachedTokens { reviewer, answers: TtlCache::new(TOKEN_CACHE_SIZE), ttl });
        Authenticator { tokens, anonymous }
    }

    /// The caller of a request with the verified `client_certificate` (the leaf) and the
    /// `Authorization` header; `Ok(None)` is unauthenticated (401). As upstream's union with
    /// anonymous last: an error is never anonymous.
    pub async fn authenticate(
        &self,
        client_certificate: Option<&CertificateDer<'_>>,
        authorization: Option<&str>,
    ) -> Result<Option<User>, Error> {
        let mut failure = None;
        if let Some(certificate) = client_certificate {
            match user_of_certificate(certificate) {
                Ok(Some(user)) => return Ok(Some(authenticated(user))),
                Ok(None) => {}
                Err(e) => failure = Some(e),
            }
        }
        if let (Some(tokens), Some(header)) = (&self.tokens, authorization) {
            match tokens.user_of(header).await {
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

impl CachedTokens {
    async fn user_of(&self, header: &str) -> Result<Option<User>, Error> {
        let Some(token) = bearer_token(header)? else { return Ok(None) };
        if let Some(answer) = self.answers.get(token) {
            return Ok(answer);
        }
        let answer = self.reviewer.review(token).await.map_err(Error::TokenReview)?;
        self.answers.insert(token.to_owned(), answer.clone(), self.ttl);
        Ok(answer)
    }
}

/// The token of `Authorization: Bearer <token>`; `None` for another scheme.
fn bearer_token(header: &str) -> Result<Option<&str>, Error> {
    let mut parts = header.trim().splitn(2, ' ');
    let scheme = parts.next().unwrap_or_default();
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Ok(None);
    }
    match parts.next().map(str::trim) {
        Some(token) if !token.is_empty() => Ok(Some(token)),
        _ => Err(Error::InvalidBearerToken),
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

    #[tokio::test]
    async fn certificates_then_tokens_then_anonymous_as_upstream_chains_them() {
        let reviewer = Arc::new(Reviewer(AtomicUsize::new(0)));
        let chain = Authenticator::new(Some((reviewer.clone(), Duration::from_secs(120))), false);
        let master = certificate("kube-apiserver-kubelet-client", &["system:masters"]);
        let user = chain.authenticate(Some(&master), Some("Bearer good")).await.unwrap().unwrap();
        assert_eq!(user.name, "kube-apiserver-kubelet-client");
        assert_eq!(user.groups, ["system:masters", AUTHENTICATED_GROUP], "the certificate wins over the token");
        assert_eq!(reviewer.0.load(Ordering::SeqCst), 0);

        let user = chain.authenticate(None, Some("Bearer good")).await.unwrap().unwrap();
        assert_eq!(
            (user.name.as_str(), user.groups.as_slice()),
            ("jane", &["dev".to_owned(), AUTHENTICATED_GROUP.to_owned()][..])
        );
        chain.authenticate(None, Some("bearer good")).await.unwrap().unwrap();
        assert_eq!(reviewer.0.load(Ordering::SeqCst), 1, "the answer is cached");

        assert!(chain.authenticate(None, Some("Bearer bad")).await.unwrap().is_none(), "401");
        assert!(chain.authenticate(None, Some("Basic amFuZTpwdw==")).await.unwrap().is_none());
        assert!(chain.authenticate(None, None).await.unwrap().is_none(), "anonymous is off by default");
        assert!(matches!(chain.authenticate(None, Some("Bearer ")).await, Err(Error::InvalidBearerToken)));
        assert!(matches!(chain.authenticate(None, Some("Bearer down")).await, Err(Error::TokenReview(_))));
        chain.authenticate(None, Some("Bearer down")).await.unwrap_err();
        assert_eq!(reviewer.0.load(Ordering::SeqCst), 4, "a failed review is asked again, never cached");

        let nameless = certificate("", &["system:masters"]);
        assert!(chain.authenticate(Some(&nameless), None).await.unwrap().is_none(), "no common name, no user");
    }

    #[tokio::test]
    async fn anonymous_gets_the_rest_but_never_a_failure() {
        let reviewer = Arc::new(Reviewer(AtomicUsize::new(0)));
        let chain = Authenticator::new(Some((reviewer, Duration::from_secs(120))), true);
        let anonymous = chain.authenticate(None, None).await.unwrap().unwrap();
        assert_eq!(anonymous, User::new(ANONYMOUS_USER, [UNAUTHENTICATED_GROUP]));
        assert_eq!(chain.authenticate(None, Some("Bearer bad")).await.unwrap().unwrap().name, ANONYMOUS_USER);
        assert!(chain.authenticate(None, Some("Bearer down")).await.is_err(), "an error is 401, not anonymous");
        let without_webhook = Authenticator::new(None, false);
        assert!(without_webhook.authenticate(None, Some("Bearer good")).await.unwrap().is_none());
    }
}
