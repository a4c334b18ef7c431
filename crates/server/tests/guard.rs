//! `Guard::handle` over every route of the kubelet API, in process and with no network: each
//! request is authenticated (client certificate, bearer token, or anonymous), asked about in one
//! SubjectAccessReview for the `nodes/node-1` subresource its path falls under and the verb its
//! method maps to, and then passed to the router (200), refused (403 `Forbidden (...)`) or failed
//! (500 `Authorization error (...)`) as the reviewer answers; a request nobody authenticates gets
//! 401 `Unauthorized` and asks nothing. A refused or failed request never reaches the router.
//!
//! The expected mapping is what `authz.rs` does today. Where that differs from upstream's v1.26
//! `pkg/kubelet/server/auth.go` (`GetRequestAttributes` gives `stats` for `/stats`, `metrics`
//! for `/metrics`, `log` for `/logs`, and `proxy` for everything else), the row says so.

// Reason: tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::Duration,
};

use async_trait::async_trait;
use axum::{Router, body::Body, extract::Request};
use http::{Method, StatusCode, header};
use kubelet_server::{
    Attributes, Authenticator, Authorizer, Decision, Guard, User,
    authn::{ANONYMOUS_USER, AUTHENTICATED_GROUP, ReviewError, TokenReviewer, UNAUTHENTICATED_GROUP},
    authz::AccessReviewer,
    tls::{ServingSlot, TlsSettings, server_config},
};
use rustls::pki_types::CertificateDer;

/// The node the guard serves.
const NODE: &str = "node-1";

/// Every route of the kubelet API (a request target) and the subresource of `nodes/node-1` it is
/// asked about.
const ROUTES: &[(&str, &str)] = &[
    ("/stats", "stats"),
    ("/stats/", "stats"),
    ("/stats/summary", "stats"),
    ("/stats/summary?only_cpu_and_memory=true", "stats"),
    ("/stats/container/ns/pod/uid/c", "stats"),
    ("/metrics", "metrics"),
    ("/metrics/cadvisor", "metrics"),
    ("/metrics/probes", "metrics"),
    ("/metrics/resource", "metrics"),
    ("/metrics/slis", "metrics"),
    ("/logs", "log"),
    ("/logs/", "log"),
    ("/logs/x", "log"),
    ("/containerLogs/ns/pod/c", "proxy"),
    // Upstream v1.26: `proxy` (its switch has no case for `/spec`).
    ("/spec/", "spec"),
    ("/pods", "proxy"),
    ("/pods/", "proxy"),
    ("/runningpods/", "proxy"),
    ("/healthz", "proxy"),
    ("/healthz/syncloop", "proxy"),
    ("/configz", "proxy"),
    ("/debug/pprof/profile", "proxy"),
    ("/debug/flags/v", "proxy"),
    ("/run/ns/pod/c", "proxy"),
    ("/run/ns/pod/uid/c", "proxy"),
    ("/exec/ns/pod/c", "proxy"),
    ("/exec/ns/pod/uid/c", "proxy"),
    ("/attach/ns/pod/c", "proxy"),
    ("/attach/ns/pod/uid/c", "proxy"),
    ("/portForward/ns/pod", "proxy"),
    ("/portForward/ns/pod/uid", "proxy"),
    // Upstream v1.26: `proxy` (its switch has no case for `/checkpoint`).
    ("/checkpoint/ns/pod/c", "checkpoint"),
    // Unknown paths, and prefixes that are not a whole path segment, fall back to `proxy`.
    ("/no/such/route", "proxy"),
    ("/statsz", "proxy"),
    ("/metricsz", "proxy"),
    ("/logsz", "proxy"),
    ("/spec2", "proxy"),
    ("/checkpoints", "proxy"),
    ("//stats/summary", "proxy"),
    // The path is matched as sent, percent-encoded. Upstream v1.26: `stats` (Go's
    // `r.URL.Path` is decoded before `isSubpath` sees it).
    ("/%73tats/summary", "proxy"),
];

/// Every method and the verb it is asked as (`create` for POST, also on `/run`, `/exec`,
/// `/attach` and `/portForward`; none for a method without an API verb).
const METHODS: [(Method, &str); 7] = [
    (Method::GET, "get"),
    (Method::HEAD, ""),
    (Method::POST, "create"),
    (Method::PUT, "update"),
    (Method::PATCH, "patch"),
    (Method::DELETE, "delete"),
    (Method::OPTIONS, ""),
];

/// What the access reviewer answers about a user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Allow,
    Deny,
    Fail,
}

/// The callers of the route table: a user, its bearer token, and the answer about it.
const CALLERS: [(&str, &str, Answer); 3] = [
    ("alice", "alice-token", Answer::Allow),
    ("bob", "bob-token", Answer::Deny),
    ("carol", "carol-token", Answer::Fail),
];

/// The token reviewer's table: the user of a token, `None` for one it rejects; a token that is
/// in neither table fails to be reviewed.
fn token_users() -> HashMap<&'static str, Option<User>> {
    let mut dave = User::new("dave", ["dev"]);
    dave.uid = "uid-dave".to_owned();
    dave.extra = BTreeMap::from([("scopes".to_owned(), vec!["a".to_owned(), "b".to_owned()])]);
    HashMap::from([
        ("alice-token", Some(User::new("alice", ["dev"]))),
        ("bob-token", Some(User::new("bob", ["dev"]))),
        ("carol-token", Some(User::new("carol", ["dev"]))),
        ("dave-token", Some(dave)),
        ("revoked-token", None),
    ])
}

/// The access reviewer's table: the answer about a user.
fn access_answers() -> HashMap<&'static str, Answer> {
    HashMap::from([
        ("alice", Answer::Allow),
        ("bob", Answer::Deny),
        ("carol", Answer::Fail),
        ("dave", Answer::Allow),
        ("kube-apiserver-kubelet-client", Answer::Allow),
        (ANONYMOUS_USER, Answer::Deny),
    ])
}

/// One SubjectAccessReview asked: what `review.rs` sends of it (its resource is always `nodes`,
/// which the refusal texts show).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Asked {
    user: String,
    uid: String,
    groups: Vec<String>,
    extra: BTreeMap<String, Vec<String>>,
    verb: String,
    subresource: String,
    name: String,
    path: String,
}

impl Asked {
    /// A review for `user` in `groups` (no UID, no extra) of `verb` on `subresource` at `target`.
    fn of(user: &str, groups: &[&str], verb: &str, subresource: &str, target: &str) -> Self {
        Asked {
            user: user.to_owned(),
            uid: String::new(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
            extra: BTreeMap::new(),
            verb: verb.to_owned(),
            subresource: subresource.to_owned(),
            name: NODE.to_owned(),
            path: target.split('?').next().unwrap().to_owned(),
        }
    }
}

/// The API server's two reviews: answers from the tables, every question recorded.
struct Reviews {
    tokens: HashMap<&'static str, Option<User>>,
    answers: HashMap<&'static str, Answer>,
    tokens_asked: Mutex<Vec<String>>,
    access_asked: Mutex<Vec<Asked>>,
}

#[async_trait]
impl TokenReviewer for Reviews {
    async fn review(&self, token: &str) -> Result<Option<User>, ReviewError> {
        self.tokens_asked.lock().unwrap().push(token.to_owned());
        self.tokens.get(token).cloned().ok_or_else(|| ReviewError("the API server is unreachable".to_owned()))
    }
}

#[async_trait]
impl AccessReviewer for Reviews {
    async fn review(&self, attributes: &Attributes) -> Result<Decision, ReviewError> {
        let user = &attributes.user;
        self.access_asked.lock().unwrap().push(Asked {
            user: user.name.clone(),
            uid: user.uid.clone(),
            groups: user.groups.clone(),
            extra: user.extra.clone(),
            verb: attributes.verb.clone(),
            subresource: attributes.subresource.to_owned(),
            name: attributes.node.clone(),
            path: attributes.path.clone(),
        });
        match self.answers.get(user.name.as_str()) {
            Some(Answer::Allow) => Ok(Decision::Allow),
            Some(Answer::Deny) => Ok(Decision::Deny),
            Some(Answer::Fail) => Err(ReviewError("the API server is unreachable".to_owned())),
            None => panic!("no answer set about {}", user.name),
        }
    }
}

/// What the router answers every request it gets.
const ROUTER_BODY: &str = r#"{"reached":"the router"}"#;

/// The content type of every refusal (Go's for upstream's plain-text `WriteErrorString`).
const TEXT: &str = "text/plain; charset=utf-8";

/// A response, read whole.
#[derive(Debug, PartialEq, Eq)]
struct Reply {
    status: StatusCode,
    content_type: Option<String>,
    body: String,
}

impl Reply {
    /// The router's answer to `method` (axum leaves out the body of a HEAD response).
    fn reached(method: &Method) -> Self {
        let body = if method == Method::HEAD { "" } else { ROUTER_BODY };
        Reply { status: StatusCode::OK, content_type: Some("application/json".to_owned()), body: body.to_owned() }
    }

    /// A refusal with `status` and `text`.
    fn refusal(status: StatusCode, text: &str) -> Self {
        Reply { status, content_type: Some(TEXT.to_owned()), body: text.to_owned() }
    }

    /// Upstream's 401.
    fn unauthorized() -> Self {
        Reply::refusal(StatusCode::UNAUTHORIZED, "Unauthorized")
    }

    /// The answer `answer` gives `user`'s `method` on `subresource`.
    fn answering(answer: Answer, method: &Method, user: &str, verb: &str, subresource: &str) -> Self {
        let what = format!("(user={user}, verb={verb}, resource=nodes, subresource={subresource})");
        match answer {
            Answer::Allow => Reply::reached(method),
            Answer::Deny => Reply::refusal(StatusCode::FORBIDDEN, &format!("Forbidden {what}")),
            Answer::Fail => Reply::refusal(StatusCode::INTERNAL_SERVER_ERROR, &format!("Authorization error {what}")),
        }
    }
}

/// A guarded node: the guard, the reviews it asks, and what reached its router.
struct Node {
    guard: Guard,
    reviews: Arc<Reviews>,
    reached: Arc<Mutex<Vec<String>>>,
}

impl Node {
    /// A node with webhook authentication and authorization (no answers kept, so every request
    /// is reviewed: the caches have their own tests) and `anonymous` requests on or off.
    fn webhook(anonymous: bool) -> Self {
        Node::new(anonymous, |reviews| Authorizer::webhook(reviews, Duration::ZERO, Duration::ZERO))
    }

    /// A node with webhook authentication and `AlwaysAllow` authorization.
    fn always_allow() -> Self {
        Node::new(false, |_| Authorizer::AlwaysAllow)
    }

    fn new(anonymous: bool, authorizer: impl FnOnce(Arc<Reviews>) -> Authorizer) -> Self {
        let reviews = Arc::new(Reviews {
            tokens: token_users(),
            answers: access_answers(),
            tokens_asked: Mutex::default(),
            access_asked: Mutex::default(),
        });
        let tokens: Arc<dyn TokenReviewer> = reviews.clone();
        let authenticator = Authenticator::new(Some((tokens, Duration::ZERO)), anonymous);
        // `handle` does no handshake, so the TLS configuration needs no serving certificate.
        let tls = server_config(Arc::new(ServingSlot::default()), &TlsSettings::default()).unwrap();
        let guard = Guard::new(tls, authenticator, authorizer(reviews.clone()), NODE);
        Node { guard, reviews, reached: Arc::default() }
    }

    /// The reply to `method` on `target` with an `Authorization` header and a client certificate.
    async fn call(
        &self,
        method: &Method,
        target: &str,
        authorization: Option<&str>,
        certificate: Option<&CertificateDer<'_>>,
    ) -> Reply {
        let mut request = Request::builder().method(method.clone()).uri(target);
        if let Some(value) = authorization {
            request = request.header(header::AUTHORIZATION, value);
        }
        let response = self.guard.handle(request.body(Body::empty()).unwrap(), certificate, self.router()).await;
        let content_type = response.headers().get(header::CONTENT_TYPE).map(|v| v.to_str().unwrap().to_owned());
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        Reply { status, content_type, body: String::from_utf8(body.to_vec()).unwrap() }
    }

    /// A router that answers every request with `ROUTER_BODY` and records it.
    fn router(&self) -> Router {
        let reached = self.reached.clone();
        Router::new().fallback(move |request: Request| async move {
            reached.lock().unwrap().push(format!("{} {}", request.method(), request.uri()));
            ([(header::CONTENT_TYPE, "application/json")], ROUTER_BODY)
        })
    }

    /// The tokens reviewed since last asked.
    fn tokens_asked(&self) -> Vec<String> {
        std::mem::take(&mut self.reviews.tokens_asked.lock().unwrap())
    }

    /// The access reviews asked since last asked.
    fn access_asked(&self) -> Vec<Asked> {
        std::mem::take(&mut self.reviews.access_asked.lock().unwrap())
    }

    /// The requests that reached the router since last asked.
    fn reached(&self) -> Vec<String> {
        std::mem::take(&mut self.reached.lock().unwrap())
    }
}

#[tokio::test]
async fn every_route_and_method_is_asked_about_as_its_subresource_and_verb_and_answered() {
    let node = Node::webhook(false);
    let mut cases = 0;
    for (target, subresource) in ROUTES {
        for (method, verb) in &METHODS {
            for (user, token, answer) in CALLERS {
                let case = format!("{method} {target} as {user} ({answer:?})");
                let reply = node.call(method, target, Some(&format!("Bearer {token}")), None).await;
                assert_eq!(reply, Reply::answering(answer, method, user, verb, subresource), "{case}");
                assert_eq!(node.tokens_asked(), [token], "{case}");
                let asked = Asked::of(user, &["dev", AUTHENTICATED_GROUP], verb, subresource, target);
                assert_eq!(node.access_asked(), [asked], "{case}");
                let reached = if answer == Answer::Allow { vec![format!("{method} {target}")] } else { vec![] };
                assert_eq!(node.reached(), reached, "{case}: only an allowed request reaches the router");
                cases += 1;
            }
        }
    }
    assert_eq!(cases, ROUTES.len() * METHODS.len() * CALLERS.len());
}

/// The credentials of a request to `GET /pods` and who the guard then asks about, when
/// `authentication.anonymous.enabled` is on or off.
struct Credentials {
    anonymous: bool,
    authorization: Option<&'static str>,
    token_reviewed: Option<&'static str>,
    /// `None`: 401, and no access review.
    asked_about: Option<&'static str>,
}

const fn credentials(
    anonymous: bool,
    authorization: Option<&'static str>,
    token_reviewed: Option<&'static str>,
    asked_about: Option<&'static str>,
) -> Credentials {
    Credentials { anonymous, authorization, token_reviewed, asked_about }
}

/// Rows: anonymous enabled, the `Authorization` header, the token reviewed, the user asked about
/// (`None`: 401).
const CREDENTIALS: &[Credentials] = &[
    credentials(false, None, None, None),
    credentials(false, Some("Bearer revoked-token"), Some("revoked-token"), None),
    credentials(false, Some("Bearer unknown-token"), Some("unknown-token"), None),
    credentials(false, Some("Bearer "), None, None),
    credentials(false, Some("Basic YWxpY2U6cHc="), None, None),
    credentials(false, Some("bearer alice-token"), Some("alice-token"), Some("alice")),
    credentials(true, None, None, Some(ANONYMOUS_USER)),
    credentials(true, Some("Basic YWxpY2U6cHc="), None, Some(ANONYMOUS_USER)),
    credentials(true, Some("Bearer alice-token"), Some("alice-token"), Some("alice")),
    // A review that fails is 401, never anonymous (upstream's `NewFailOnError`).
    credentials(true, Some("Bearer unknown-token"), Some("unknown-token"), None),
    // The crate refuses an empty bearer token as invalid, anonymous or not. Upstream v1.26's
    // bearertoken authenticator ignores it (`return nil, false, nil`), so it is anonymous there.
    credentials(true, Some("Bearer "), None, None),
    // The crate treats a token the API server rejects as no credentials: anonymous. Upstream
    // v1.26 answers 401: its bearertoken authenticator turns the rejection into an error
    // (`err = invalidToken`) and anonymous is chained with `unionauth.NewFailOnError`.
    credentials(true, Some("Bearer revoked-token"), Some("revoked-token"), Some(ANONYMOUS_USER)),
    // The crate's token is everything after the scheme, trimmed. Upstream v1.26 splits the
    // header on single spaces (`strings.SplitN(auth, " ", 3)`) and takes the second part: an
    // empty token here (401), and `alice-token` on the next row.
    credentials(false, Some("Bearer  alice-token"), Some("alice-token"), Some("alice")),
    credentials(false, Some("Bearer alice-token trailing"), Some("alice-token trailing"), None),
];

#[tokio::test]
async fn the_credentials_decide_who_is_asked_about_and_without_any_it_is_401_asking_nothing() {
    for row in CREDENTIALS {
        let node = Node::webhook(row.anonymous);
        let case = format!("anonymous {}, Authorization {:?}", row.anonymous, row.authorization);
        let reply = node.call(&Method::GET, "/pods", row.authorization, None).await;
        assert_eq!(node.tokens_asked(), Vec::from_iter(row.token_reviewed), "{case}");
        let Some(user) = row.asked_about else {
            assert_eq!(reply, Reply::unauthorized(), "{case}");
            assert_eq!(node.access_asked(), [], "{case}");
            assert_eq!(node.reached(), Vec::<String>::new(), "{case}");
            continue;
        };
        let answer = access_answers()[user];
        assert_eq!(reply, Reply::answering(answer, &Method::GET, user, "get", "proxy"), "{case}");
        let groups =
            if user == ANONYMOUS_USER { [UNAUTHENTICATED_GROUP].as_slice() } else { &["dev", AUTHENTICATED_GROUP] };
        assert_eq!(node.access_asked(), [Asked::of(user, groups, "get", "proxy", "/pods")], "{case}");
        let reached = if answer == Answer::Allow { vec!["GET /pods"] } else { vec![] };
        assert_eq!(node.reached(), reached, "{case}");
    }
}

/// A client certificate for `common_name` in `organizations`.
fn certificate(common_name: &str, organizations: &[&str]) -> CertificateDer<'static> {
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    if !common_name.is_empty() {
        params.distinguished_name.push(rcgen::DnType::CommonName, common_name);
    }
    for organization in organizations {
        params.distinguished_name.push(rcgen::DnType::OrganizationName, *organization);
    }
    let key = rcgen::KeyPair::generate().unwrap();
    params.self_signed(&key).unwrap().der().clone()
}

#[tokio::test]
async fn the_user_asked_about_is_the_certificates_else_the_tokens_with_its_uid_and_extra() {
    let node = Node::webhook(false);
    let apiserver = certificate("kube-apiserver-kubelet-client", &["system:masters"]);

    let reply = node.call(&Method::GET, "/stats/summary", Some("Bearer bob-token"), Some(&apiserver)).await;
    assert_eq!(reply, Reply::reached(&Method::GET), "the certificate wins over the token");
    assert_eq!(node.tokens_asked(), Vec::<String>::new(), "the token is not reviewed");
    let asked = Asked::of(
        "kube-apiserver-kubelet-client",
        &["system:masters", AUTHENTICATED_GROUP],
        "get",
        "stats",
        "/stats/summary",
    );
    assert_eq!(node.access_asked(), [asked]);
    assert_eq!(node.reached(), ["GET /stats/summary"]);

    let nameless = certificate("", &["system:masters"]);
    let reply = node.call(&Method::POST, "/exec/ns/pod/c", Some("Bearer dave-token"), Some(&nameless)).await;
    assert_eq!(reply, Reply::reached(&Method::POST), "a certificate without a common name is no user: the token is");
    assert_eq!(node.tokens_asked(), ["dave-token"]);
    let mut asked = Asked::of("dave", &["dev", AUTHENTICATED_GROUP], "create", "proxy", "/exec/ns/pod/c");
    asked.uid = "uid-dave".to_owned();
    asked.extra = BTreeMap::from([("scopes".to_owned(), vec!["a".to_owned(), "b".to_owned()])]);
    assert_eq!(node.access_asked(), [asked]);
    assert_eq!(node.reached(), ["POST /exec/ns/pod/c"]);

    let reply = node.call(&Method::GET, "/pods", None, Some(&nameless)).await;
    assert_eq!(reply, Reply::unauthorized(), "nor is it anonymous when anonymous is off");
    assert_eq!(node.access_asked(), []);
}

#[tokio::test]
async fn always_allow_lets_every_authenticated_request_through_without_a_review() {
    let node = Node::always_allow();
    for (target, _) in ROUTES {
        for (method, _) in &METHODS {
            let case = format!("{method} {target}");
            let reply = node.call(method, target, Some("Bearer bob-token"), None).await;
            assert_eq!(reply, Reply::reached(method), "{case}");
            assert_eq!(node.access_asked(), [], "{case}");
            assert_eq!(node.reached(), [case]);
        }
    }
    let reply = node.call(&Method::GET, "/pods", None, None).await;
    assert_eq!(reply, Reply::unauthorized(), "authentication still applies");
    assert_eq!(node.reached(), Vec::<String>::new());
}
