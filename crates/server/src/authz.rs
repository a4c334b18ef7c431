//! What a caller may do, as upstream's kubelet authorizes it at the version the agent reports
//! (v1.36, where fine-grained kubelet authorization is always on): a request is mapped to the
//! attributes of the Node's subresources it reads (upstream `GetRequestAttributes`), first a
//! subresource of its own where it has one and then `proxy`, and it is allowed when any of them
//! is. `AlwaysAllow` allows them all; `Webhook` asks the API server with a SubjectAccessReview.

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use http::Method;

use crate::{
    authn::{ReviewError, User},
    cache::TtlCache,
};

/// What a request asks to do, as the API server's authorizer sees it: exactly what a
/// SubjectAccessReview sends, so that answers are kept by what was asked.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Attributes {
    /// The caller.
    pub user: User,
    /// The API verb of the HTTP method (`get`, `create`, `update`, `patch`, `delete`; empty for
    /// any other method, as upstream's).
    pub verb: String,
    /// The subresource of `nodes/<name>`: `pods`, `healthz`, `configz`, `statusz`, `stats`,
    /// `metrics`, `log`, `checkpoint` or `proxy`.
    pub subresource: &'static str,
    /// The node's name.
    pub node: String,
}

impl Attributes {
    /// The attributes a request by `user` with `method` on `path` (percent-encoded, as sent) to
    /// node `node` is authorized by, in the order they are asked: allowed when any one is.
    pub fn of_request(user: User, method: &Method, path: &str, node: &str) -> Vec<Self> {
        let verb = match *method {
            Method::POST => "create",
            Method::GET => "get",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE => "delete",
            _ => "",
        };
        let path = percent_encoding::percent_decode_str(path).decode_utf8_lossy();
        subresources(&path)
            .into_iter()
            .map(|subresource| Attributes {
                user: user.clone(),
                verb: verb.to_owned(),
                subresource,
                node: node.to_owned(),
            })
            .collect()
    }

    /// Upstream's text for a failed review (500) of these attributes.
    pub fn describe_error(&self) -> String {
        format!(
            "Authorization error (user={}, verb={}, resource=nodes, subresource={})",
            self.user.name, self.verb, self.subresource
        )
    }
}

/// Upstream's text for a request none of whose `attributes` is allowed (403).
pub fn describe_forbidden(attributes: &[Attributes]) -> String {
    let (user, verb) = attributes.first().map_or(("", ""), |first| (first.user.name.as_str(), first.verb.as_str()));
    let subresources: Vec<&str> = attributes.iter().map(|a| a.subresource).collect();
    format!("Forbidden (user={user}, verb={verb}, resource=nodes, subresource(s)=[{}])\n", subresources.join(" "))
}

/// The subresources a (decoded) path is authorized by: its own first, where it has one of
/// fine-grained authorization's, then `stats`, `metrics`, `log` or `checkpoint` for those, or
/// `proxy` for the rest.
fn subresources(path: &str) -> Vec<&'static str> {
    const FINE_GRAINED: [(&str, &str); 5] = [
        ("/pods", "pods"),
        ("/healthz", "healthz"),
        ("/configz", "configz"),
        ("/statusz", "statusz"),
        ("/runningpods", "pods"),
    ];
    const OWN: [(&str, &str); 4] =
        [("/stats", "stats"), ("/metrics", "metrics"), ("/logs", "log"), ("/checkpoint", "checkpoint")];
    let under = |table: &[(&str, &'static str)]| {
        table.iter().find(|(prefix, _)| is_subpath(path, prefix)).map(|(_, subresource)| *subresource)
    };
    let mut subresources: Vec<&'static str> = under(&FINE_GRAINED).into_iter().collect();
    subresources.push(under(&OWN).unwrap_or("proxy"));
    subresources
}

/// `path` is `prefix` or below it.
fn is_subpath(path: &str, prefix: &str) -> bool {
    path.strip_prefix(prefix).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// The answer to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decision {
    /// Allowed.
    Allow,
    /// Refused, or no opinion (upstream's kubelet has only the one authorizer).
    Deny,
}

/// Asks the API server whether a user may do something (a SubjectAccessReview).
#[async_trait]
pub trait AccessReviewer: Send + Sync {
    /// Whether `attributes` are allowed.
    async fn review(&self, attributes: &Attributes) -> Result<Decision, ReviewError>;
}

/// `authorization.mode`.
pub enum Authorizer {
    /// Every authenticated request is allowed.
    AlwaysAllow,
    /// A SubjectAccessReview for each request, answers cached.
    Webhook(Box<CachedReviews>),
}

/// A reviewer with upstream's answer cache: allowed answers kept for one TTL, denied ones for
/// another, failures never.
pub struct CachedReviews {
    reviewer: Arc<dyn AccessReviewer>,
    answers: TtlCache<Attributes, Decision>,
    allowed_ttl: Duration,
    denied_ttl: Duration,
}

/// How many answers are kept (upstream's webhook authorizer's cache size).
const REVIEW_CACHE_SIZE: usize = 8192;

impl Authorizer {
    /// `Webhook` with `reviewer`, answers kept `allowed_ttl` and `denied_ttl`.
    pub fn webhook(reviewer: Arc<dyn AccessReviewer>, allowed_ttl: Duration, denied_ttl: Duration) -> Self {
        let reviews = CachedReviews { reviewer, answers: TtlCache::new(REVIEW_CACHE_SIZE), allowed_ttl, denied_ttl };
        Authorizer::Webhook(Box::new(reviews))
    }

    /// Whether `attributes` are allowed.
    pub async fn authorize(&self, attributes: &Attributes) -> Result<Decision, ReviewError> {
        let reviews = match self {
            Authorizer::AlwaysAllow => return Ok(Decision::Allow),
            Authorizer::Webhook(reviews) => reviews,
        };
        if let Some(decision) = reviews.answers.get(attributes) {
            return Ok(decision);
        }
        let decision = reviews.reviewer.review(attributes).await?;
        let ttl = match decision {
            Decision::Allow => reviews.allowed_ttl,
            Decision::Deny => reviews.denied_ttl,
        };
        reviews.answers.insert(attributes.clone(), decision, ttl);
        Ok(decision)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn paths_map_to_node_subresources_and_methods_to_verbs_as_upstream() {
        let user = User::new("jane", ["dev"]);
        for (method, path, verb, subresources) in [
            (Method::GET, "/stats/summary", "get", &["stats"][..]),
            (Method::GET, "/stats", "get", &["stats"]),
            (Method::GET, "/statsz", "get", &["proxy"]),
            (Method::GET, "/metrics", "get", &["metrics"]),
            (Method::GET, "/metrics/resource", "get", &["metrics"]),
            (Method::GET, "/metrics/cadvisor", "get", &["metrics"]),
            (Method::GET, "/logs/", "get", &["log"]),
            (Method::GET, "/spec/", "get", &["proxy"]),
            (Method::POST, "/checkpoint/ns/pod/c", "create", &["checkpoint"]),
            (Method::GET, "/containerLogs/ns/pod/c", "get", &["proxy"]),
            (Method::POST, "/exec/ns/pod/c", "create", &["proxy"]),
            (Method::GET, "/pods", "get", &["pods", "proxy"]),
            (Method::PUT, "/pods", "update", &["pods", "proxy"]),
            (Method::PATCH, "/pods/", "patch", &["pods", "proxy"]),
            (Method::DELETE, "/pods", "delete", &["pods", "proxy"]),
            (Method::GET, "/podsz", "get", &["proxy"]),
            (Method::GET, "/runningpods/", "get", &["pods", "proxy"]),
            (Method::HEAD, "/healthz", "", &["healthz", "proxy"]),
            (Method::GET, "/healthz/syncloop", "get", &["healthz", "proxy"]),
            (Method::GET, "/configz", "get", &["configz", "proxy"]),
            (Method::GET, "/statusz", "get", &["statusz", "proxy"]),
            // Matched decoded, as Go's `r.URL.Path` is.
            (Method::GET, "/%73tats/summary", "get", &["stats"]),
            (Method::GET, "/stats%2Fsummary", "get", &["stats"]),
        ] {
            let attributes = Attributes::of_request(user.clone(), &method, path, "node-1");
            let asked: Vec<&str> = attributes.iter().map(|a| a.subresource).collect();
            assert_eq!(asked, subresources, "{method} {path}");
            assert!(attributes.iter().all(|a| a.verb == verb && a.node == "node-1"), "{method} {path}");
        }
        let attributes = Attributes::of_request(user, &Method::GET, "/pods", "node-1");
        assert_eq!(
            describe_forbidden(&attributes),
            "Forbidden (user=jane, verb=get, resource=nodes, subresource(s)=[pods proxy])\n"
        );
        assert_eq!(
            attributes[0].describe_error(),
            "Authorization error (user=jane, verb=get, resource=nodes, subresource=pods)"
        );
    }

    struct Reviewer(AtomicUsize);

    #[async_trait]
    impl AccessReviewer for Reviewer {
        async fn review(&self, attributes: &Attributes) -> Result<Decision, ReviewError> {
            self.0.fetch_add(1, Ordering::SeqCst);
            match attributes.user.name.as_str() {
                "admin" => Ok(Decision::Allow),
                "down" => Err(ReviewError("connection refused".to_owned())),
                _ => Ok(Decision::Deny),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn webhook_answers_are_cached_for_their_own_ttl_and_failures_never() {
        let reviewer = Arc::new(Reviewer(AtomicUsize::new(0)));
        let authorizer = Authorizer::webhook(reviewer.clone(), Duration::from_secs(300), Duration::from_secs(30));
        let ask = |name: &str| Attributes::of_request(User::new(name, [""; 0]), &Method::GET, "/stats", "n").remove(0);
        let calls = || reviewer.0.load(Ordering::SeqCst);
        assert_eq!(authorizer.authorize(&ask("admin")).await.unwrap(), Decision::Allow);
        assert_eq!(authorizer.authorize(&ask("jane")).await.unwrap(), Decision::Deny);
        authorizer.authorize(&ask("admin")).await.unwrap();
        authorizer.authorize(&ask("jane")).await.unwrap();
        assert_eq!(calls(), 2);
        // Kept by what the review asks, which has no path: a new path under /stats asks nothing.
        for path in ["/stats/summary", "/stats/container/ns/pod/uid/c", "/stats/a-path-never-seen"] {
            let attributes = Attributes::of_request(User::new("admin", [""; 0]), &Method::GET, path, "n");
            assert_eq!(authorizer.authorize(&attributes[0]).await.unwrap(), Decision::Allow);
        }
        assert_eq!(calls(), 2, "no new review for a new path");
        tokio::time::advance(Duration::from_secs(31)).await;
        authorizer.authorize(&ask("admin")).await.unwrap();
        authorizer.authorize(&ask("jane")).await.unwrap();
        assert_eq!(calls(), 3, "the denial expired, the allowance did not");
        authorizer.authorize(&ask("down")).await.unwrap_err();
        authorizer.authorize(&ask("down")).await.unwrap_err();
        assert_eq!(calls(), 5);
        assert_eq!(Authorizer::AlwaysAllow.authorize(&ask("jane")).await.unwrap(), Decision::Allow);
    }
}
