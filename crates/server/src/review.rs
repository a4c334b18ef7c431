//! The reviews asked of the API server: TokenReview for bearer tokens, SubjectAccessReview for
//! each request's attributes.

use async_trait::async_trait;
use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec},
    authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
};
use kube::{Api, Client, api::PostParams};

use crate::{
    authn::{ReviewError, TokenReviewer, User},
    authz::{AccessReviewer, Attributes, Decision},
};

/// Both reviews, through the node's API client.
#[derive(Clone)]
pub struct ApiReviews {
    client: Client,
}

impl ApiReviews {
    /// Reviews asked with `client` (the node's own credentials may create both).
    pub fn new(client: Client) -> Self {
        ApiReviews { client }
    }
}

#[async_trait]
impl TokenReviewer for ApiReviews {
    async fn review(&self, token: &str) -> Result<Option<User>, ReviewError> {
        let review = TokenReview {
            spec: TokenReviewSpec { token: token.to_owned(), audiences: None },
            ..TokenReview::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let answer = api.create(&PostParams::default(), &review).await.map_err(|e| ReviewError(e.to_string()))?;
        let status = answer.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            return match status.error.filter(|e| !e.is_empty()) {
                Some(error) => Err(ReviewError(error)),
                None => Ok(None),
            };
        }
        let info = status.user.unwrap_or_default();
        let mut user = User::new(info.username.unwrap_or_default(), info.groups.unwrap_or_default());
        user.uid = info.uid.unwrap_or_default();
        user.extra = info.extra.unwrap_or_default().into_iter().collect();
        Ok(Some(user))
    }
}

#[async_trait]
impl AccessReviewer for ApiReviews {
    async fn review(&self, attributes: &Attributes) -> Result<Decision, ReviewError> {
        let user = &attributes.user;
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
                groups: Some(user.groups.clone()),
                extra: (!user.extra.is_empty()).then(|| user.extra.clone().into_iter().collect()),
                resource_attributes: Some(ResourceAttributes {
                    namespace: Some(String::new()),
                    verb: Some(attributes.verb.clone()),
                    group: Some(String::new()),
                    version: Some("v1".to_owned()),
                    resource: Some("nodes".to_owned()),
                    subresource: Some(attributes.subresource.to_owned()),
                    name: Some(attributes.node.clone()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answer = api.create(&PostParams::default(), &review).await.map_err(|e| ReviewError(e.to_string()))?;
        let allowed = answer.status.is_some_and(|s| s.allowed);
        Ok(if allowed { Decision::Allow } else { Decision::Deny })
    }
}
