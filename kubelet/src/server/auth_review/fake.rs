//! A table-driven [`AuthReview`] that counts its calls.
use super::*;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

#[derive(Default)]
pub struct FakeReview {
    tokens: Mutex<HashMap<String, UserInfo>>,
    /// (user, verb, subresource)
    grants: Mutex<HashSet<(String, String, String)>>,
    pub down: AtomicBool,
    pub token_calls: AtomicU64,
    pub access_calls: AtomicU64,
}

impl FakeReview {
    pub fn token(&self, token: &str, user: &str, groups: &[&str]) {
        self.tokens.lock().unwrap().insert(
            token.into(),
            UserInfo {
                name: user.into(),
                groups: groups.iter().map(|g| g.to_string()).collect(),
                ..Default::default()
            },
        );
    }

    pub fn grant(&self, user: &str, verb: &str, subresource: &str) {
        self.grants
            .lock()
            .unwrap()
            .insert((user.into(), verb.into(), subresource.into()));
    }

    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    fn check_down(&self, kind: &'static str) -> Result<(), ReviewError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(ReviewError {
                kind,
                message: "connection refused".into(),
            });
        }
        Ok(())
    }
}

impl AuthReview for FakeReview {
    fn review_token(&self, token: String) -> BoxFuture<'_, Result<TokenOutcome, ReviewError>> {
        self.token_calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            self.check_down("TokenReview")?;
            Ok(match self.tokens.lock().unwrap().get(&token) {
                Some(u) => TokenOutcome::Authenticated(u.clone()),
                None => TokenOutcome::Rejected(String::new()),
            })
        })
    }

    fn review_access(
        &self,
        a: AccessAttributes,
    ) -> BoxFuture<'_, Result<AccessDecision, ReviewError>> {
        self.access_calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            self.check_down("SubjectAccessReview")?;
            let allowed = self.grants.lock().unwrap().contains(&(
                a.user.name.clone(),
                a.verb.clone(),
                a.subresource.clone(),
            ));
            Ok(AccessDecision {
                allowed,
                reason: String::new(),
            })
        })
    }
}
