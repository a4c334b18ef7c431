//! What a caller may do, as upstream's kubelet authorizes it: a request is mapped to the
//! attributes of the Node's subresource it reads (upstream `GetRequestAttributes`), which
//! `AlwaysAllow` allows and `Webhook` asks of the API server with a SubjectAccessReview.

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use http::Method;

use crate::{
    authn::{ReviewError, User},
    cache::TtlCache,
};

/// What a request asks to do, as the API server's authorizer sees it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Attributes {
    /// The caller.
    pub user: User,
    /// The API verb of the HTTP method (`get`, `create`, `update`, `patch`, `delete`; empty for
    /// any other method, as upstream's).
    pub verb: String,
    /// The subresource of `nodes/<name>` the path falls under: `stats`, `metrics`, `log`,
    /// `spec`, `checkpoint`, or `proxy` for the rest.
    pub subresource: &'static str,
    /// The node's name.
    pub node: String,
    /// The request's path.
    pub path: String,
}

impl Attributes {
    /// The attributes of a request by `user` with `method` on `path` to node `node`.
    pub fn of(user: User, method: &Method, path: &str, node: &str) -> Self {
        let verb = match *method {
            Method::POST => "create",
            Method::GET => "get",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE => "delete",
            _ => "",
        };
        Attributes {
            user,
            verb: verb.to_owned(),
            subresource: subresource(path),
            node: node.to_owned(),
            path: path.to_owned(),
        }
    }

    /// Upstream's text for a refusal (403) or a failed review (500).
    pub fn describe(&self, what: &str) -> String {
        format!(
            "{what} (user={}, verb={}, resource=nodes, subresource={})",
            self.user.name, self.verb, self.subresource
        )
    }
}

/// The subresource a path falls under.
fn subresource(path: &str) -> &'static str {
    const SUBRESOURCES: [(&str, &str); 5] = [
        ("/stats", "stats"),
        ("/metrics", "metrics"),
        ("/logs", "log"),
        ("/spec", "spec"),
        ("/checkpoint", "checkpoint"),
    ];
    SUBRESOURCES.iter().find(|(prefix, _)| is_subpath(path, prefix)).map_or("proxy", |(_, subresource)| subresource)
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
const REVIEW_CACHE_SIZE: usize = 1024;

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
        for (method, path, verb, subresource) in [
            (Method::GET, "/stats/summary", "get", "stats"),
            (Method::GET, "/stats", "get", "stats"),
            (Method::GET, "/statsz", "get", "proxy"),
            (Method::GET, "/metrics", "get", "metrics"),
            (Method::GET, "/metrics/resource", "get", "metrics"),
            (Method::GET, "/metrics/cadvisor", "get", "metrics"),
            (Method::GET, "/logs/", "get", "log"),
            (Method::GET, "/spec/", "get", "spec"),
            (Method::POST, "/checkpoint/ns/pod/c", "create", "checkpoint"),
            (Method::GET, "/containerLogs/ns/pod/c", "get", "proxy"),
            (Method::POST, "/exec/ns/pod/c", "create", "proxy"),
            (Method::GET, "/pods", "get", "proxy"),
            (Method::PUT, "/pods", "update", "proxy"),
            (Method::PATCH, "/pods", "patch", "proxy"),
            (Method::DELETE, "/pods", "delete", "proxy"),
            (Method::HEAD, "/healthz", "", "proxy"),
        ] {
            let attributes = Attributes::of(user.clone(), &method, path, "node-1");
            assert_eq!((attributes.verb.as_str(), attributes.subresource), (verb, subresource), "{method} {path}");
            assert_eq!(attributes.node, "node-1");
        }
        let attributes = Attributes::of(user, &Method::GET, "/stats/summary", "node-1");
        assert_eq!(
            attributes.describe("Forbidden"),
            "Forbidden (user=jane, verb=get, resource=nodes, subresource=stats)"
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
        let ask = |name: &str| Attributes::of(User::new(name, [""; 0]), &Method::GET, "/pods", "n");
        let calls = || reviewer.0.load(Ordering::SeqCst);
        assert_eq!(authorizer.authorize(&ask("admin")).await.unwrap(), Decision::Allow);
        assert_eq!(authorizer.authorize(&ask("jane")).await.unwrap(), Decision::Deny);
        authorizer.authorize(&ask("admin")).await.unwrap();
        authorizer.authorize(&ask("jane")).await.unwrap();
        assert_eq!(calls(), 2);
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
