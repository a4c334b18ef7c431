//! `Guard::handle` over every route of the kubelet API, in process and with no network: each
//! request is authenticated (client certificate, bearer token, or anonymous), asked about in
//! SubjectAccessReviews for the `nodes/node-1` subresources its path falls under, in order, with
//! the verb its method maps to, and then passed to the router (200) at the first allowed, refused
//! (403 `Forbidden (...)`) when none is, or failed (500 `Authorization error (...)`) at the first
//! review that fails; a request nobody authenticates gets 401 `Unauthorized` and asks nothing. A
//! refused or failed request never reaches the router.
//!
//! The mapping is upstream's `GetRequestAttributes` (`pkg/kubelet/server/auth.go`) at v1.36, the
//! version the agent reports, where fine-grained kubelet authorization is always on: `pods`,
//! `healthz`, `configz` and `statusz` first, then `proxy`; `stats`, `metrics`, `log` and
//! `checkpoint` alone; `proxy` for the rest; the path matched decoded, as Go's `URL.Path` is.

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

/// Every route of the kubelet API (a request target) and the subresources of `nodes/node-1` it is
/// asked about, in order.
const ROUTES: &[(&str, &[&str])] = &[
    ("/stats", &["stats"]),
    ("/stats/", &["stats"]),
    ("/stats/summary", &["stats"]),
    ("/stats/summary?only_cpu_and_memory=true", &["stats"]),
    ("/stats/container/ns/pod/uid/c", &["stats"]),
    ("/metrics", &["metrics"]),
    ("/metrics/cadvisor", &["metrics"]),
    ("/metrics/probes", &["metrics"]),
    ("/metrics/resource", &["metrics"]),
    ("/metrics/slis", &["metrics"]),
    ("/logs", &["log"]),
    ("/logs/", &["log"]),
    ("/logs/x", &["log"]),
    ("/containerLogs/ns/pod/c", &["proxy"]),
    // No subresource of its own since cAdvisor's JSON endpoints went (v1.21).
    ("/spec/", &["proxy"]),
    ("/pods", &["pods", "proxy"]),
    ("/pods/", &["pods", "proxy"]),
    ("/runningpods/", &["pods", "proxy"]),
    ("/healthz", &["healthz", "proxy"]),
    ("/healthz/syncloop", &["healthz", "proxy"]),
    ("/configz", &["configz", "proxy"]),
    ("/statusz", &["statusz", "proxy"]),
    ("/debug/pprof/profile", &["proxy"]),
    ("/debug/flags/v", &["proxy"]),
    ("/run/ns/pod/c", &["proxy"]),
    ("/run/ns/pod/uid/c", &["proxy"]),
    ("/exec/ns/pod/c", &["proxy"]),
    ("/exec/ns/pod/uid/c", &["proxy"]),
    ("/attach/ns/pod/c", &["proxy"]),
    ("/attach/ns/pod/uid/c", &["proxy"]),
    ("/portForward/ns/pod", &["proxy"]),
    ("/portForward/ns/pod/uid", &["proxy"]),
    ("/checkpoint/ns/pod/c", &["checkpoint"]),
    // Unknown paths, and prefixes that are not a whole path segment, fall back to `proxy`.
    ("/no/such/route", &["proxy"]),
    ("/statsz", &["proxy"]),
    ("/metricsz", &["proxy"]),
    ("/logsz", &["proxy"]),
    ("/spec2", &["proxy"]),
    ("/checkpoints", &["proxy"]),
    ("/podsz", &["proxy"]),
    ("/healthzz", &["proxy"]),
    ("//stats/summary", &["proxy"]),
    // The path is matched decoded, as Go's `r.URL.Path` is.
    ("/%73tats/summary", &["stats"]),
    ("/stats%2Fsummary", &["stats"]),
    ("/%70ods", &["pods", "proxy"]),
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
}

impl Asked {
    /// A review for `user` in `groups` (no UID, no extra) of `verb` on `subresource`.
    fn of(user: &str, groups: &[&str], verb: &str, subresource: &str) -> Self {
        Asked {
            user: user.to_owned(),
            uid: String::new(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
            extra: BTreeMap::new(),
            verb: verb.to_owned(),
            subresource: subresource.to_owned(),
            name: NODE.to_owned(),
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

    /// The answer `answer` gives `user`'s `method` on `subresources`: the first review that fails
    /// names its subresource, a refusal names them all.
    fn answering(answer: Answer, method: &Method, user: &str, verb: &str, subresources: &[&str]) -> Self {
        match answer {
            Answer::Allow => Reply::reached(method),
            Answer::Deny => {
                let all = subresources.join(" ");
                let text = format!("Forbidden (user={user}, verb={verb}, resource=nodes, subresource(s)=[{all}])\n");
                Reply::refusal(StatusCode::FORBIDDEN, &text)
            }
            Answer::Fail => {
                let first = subresources[0];
                let text =
                    format!("Authorization error (user={user}, verb={verb}, resource=nodes, subresource={first})");
                Reply::refusal(StatusCode::INTERNAL_SERVER_ERROR, &text)
            }
        }
    }

    /// The subresources asked about before `answer` decides: the first allowed or failed one,
    /// or every one when each is refused.
    fn asked<'s>(answer: Answer, subresources: &[&'s str]) -> Vec<&'s str> {
        if answer == Answer::Deny { subresources.to_vec() } else { subresources[..1].to_vec() }
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
    for (target, subresources) in ROUTES {
        for (method, verb) in &METHODS {
            for (user, token, answer) in CALLERS {
                let case = format!("{method} {target} as {user} ({answer:?})");
                let reply = node.call(method, target, Some(&format!("Bearer {token}")), None).await;
                assert_eq!(reply, Reply::answering(answer, method, user, verb, subresources), "{case}");
                assert_eq!(node.tokens_asked(), [token], "{case}");
                let groups = &["dev", AUTHENTICATED_GROUP];
                let asked: Vec<Asked> = Reply::asked(answer, subresources)
                    .into_iter()
                    .map(|subresource| Asked::of(user, groups, verb, subresource))
                    .collect();
                assert_eq!(node.access_asked(), asked, "{case}");
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
    // `Bearer ` is no token at all: no credentials, so anonymous.
    credentials(true, Some("Bearer "), None, Some(ANONYMOUS_USER)),
    // A token the API server rejects is an error (`invalid bearer token`): 401, not anonymous.
    credentials(true, Some("Bearer revoked-token"), Some("revoked-token"), None),
    // The header is split on single spaces (`strings.SplitN(auth, " ", 3)`) and the token is the
    // second part: empty here (no credentials), and `alice-token` on the next row.
    credentials(false, Some("Bearer  alice-token"), None, None),
    credentials(true, Some("Bearer  alice-token"), None, Some(ANONYMOUS_USER)),
    credentials(false, Some("Bearer alice-token trailing"), Some("alice-token"), Some("alice")),
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
        let subresources = ["pods", "proxy"];
        assert_eq!(reply, Reply::answering(answer, &Method::GET, user, "get", &subresources), "{case}");
        let groups =
            if user == ANONYMOUS_USER { [UNAUTHENTICATED_GROUP].as_slice() } else { &["dev", AUTHENTICATED_GROUP] };
        let asked: Vec<Asked> =
            Reply::asked(answer, &subresources).into_iter().map(|sub| Asked::of(user, groups, "get", sub)).collect();
        assert_eq!(node.access_asked(), asked, "{case}");
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
    let asked = Asked::of("kube-apiserver-kubelet-client", &["system:masters", AUTHENTICATED_GROUP], "get", "stats");
    assert_eq!(node.access_asked(), [asked]);
    assert_eq!(node.reached(), ["GET /stats/summary"]);

    let nameless = certificate("", &["system:masters"]);
    let reply = node.call(&Method::POST, "/exec/ns/pod/c", Some("Bearer dave-token"), Some(&nameless)).await;
    assert_eq!(reply, Reply::reached(&Method::POST), "a certificate without a common name is no user: the token is");
    assert_eq!(node.tokens_asked(), ["dave-token"]);
    let mut asked = Asked::of("dave", &["dev", AUTHENTICATED_GROUP], "create", "proxy");
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
