//! Who asks: an API token in `Authorization: Bearer`, checked against the tokens the store
//! holds, kept in memory so that a request with a bad token costs no query.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;

use governor::DefaultDirectRateLimiter;
use governor::clock::Clock as _;

use super::{ApiError, ApiState};
use crate::admin::{AdminError, ApiToken, Scope, Who, record};
use crate::guard::quota;
use crate::store::ApiTokenRow;

/// How often the tokens are read again from the store: a token made or revoked on another
/// instance takes effect here within this.
pub const REFRESH: Duration = Duration::from_secs(2);

/// One token's request rates: every request 50/s (burst 100), writes also 5/s (burst 10).
pub(super) struct Rates {
    all: DefaultDirectRateLimiter,
    writes: DefaultDirectRateLimiter,
}

impl Default for Rates {
    fn default() -> Self {
        Self {
            all: quota(50, 100),
            writes: quota(5, 10),
        }
    }
}

impl std::fmt::Debug for Rates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rates").finish_non_exhaustive()
    }
}

/// Takes a token from `bucket`, or says how long until one comes.
fn take(bucket: &DefaultDirectRateLimiter) -> Result<(), ApiError> {
    bucket
        .check()
        .map_err(|not_until| ApiError::rate_limited(not_until.wait_time_from(bucket.clock().now())))
}

/// The API tokens the store holds, by id, each with its rates (kept across refreshes).
#[derive(Debug, Default)]
pub(super) struct Tokens(RwLock<HashMap<String, (ApiTokenRow, Arc<Rates>)>>);

impl Tokens {
    pub(super) fn replace(&self, rows: Vec<ApiTokenRow>) {
        let mut known = self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let map = rows
            .into_iter()
            .map(|r| {
                let rates = known
                    .get(&r.id)
                    .map_or_else(Arc::default, |(_, rates)| rates.clone());
                (r.id.clone(), (r, rates))
            })
            .collect();
        *known = map;
    }

    fn get(&self, id: &str) -> Option<(ApiTokenRow, Arc<Rates>)> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(id)
            .cloned()
    }
}

/// Who asks, and what they may do.
#[derive(Debug, Clone)]
pub struct Caller {
    /// As the audit log names them.
    pub who: Who,
    /// What they may do.
    pub scope: Scope,
    /// Their request rates.
    rates: Arc<Rates>,
}

impl Caller {
    /// Whether the caller may do what `needs` allows.
    ///
    /// # Errors
    /// `forbidden`, naming the scope needed.
    pub fn may(&self, needs: Scope) -> Result<(), ApiError> {
        if self.scope >= needs {
            Ok(())
        } else {
            Err(forbidden(needs).into())
        }
    }

    /// Whether the caller may make the change `action` on `target`, which `needs` allows;
    /// a refusal is recorded in the audit log.
    ///
    /// # Errors
    /// `forbidden`, naming the scope needed.
    pub async fn may_change(
        &self,
        state: &ApiState,
        needs: Scope,
        action: &str,
        target: &str,
    ) -> Result<(), ApiError> {
        if self.scope >= needs {
            return take(&self.rates.writes);
        }
        let details = serde_json::json!({ "scope": self.scope, "needs": needs });
        let refused: Result<(), AdminError> = Err(forbidden(needs));
        record(
            state.nms.store(),
            &self.who,
            action,
            target,
            details,
            refused,
        )
        .await
        .map_err(ApiError::from)
    }
}

/// Why a caller without the scope `needs` is refused.
fn forbidden(needs: Scope) -> AdminError {
    AdminError::Forbidden(format!("this needs the {needs} scope"))
}

impl FromRequestParts<Arc<ApiState>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<ApiState>,
    ) -> Result<Self, Self::Rejection> {
        // The same answer whatever is wrong: no header, not a token, unknown, ended, revoked.
        let text = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(ApiError::unauthorized)?;
        let token = ApiToken::parse(text.trim()).ok_or_else(ApiError::unauthorized)?;
        let (row, rates) = state
            .tokens
            .get(&token.id)
            .filter(|(row, _)| token.matches(row, super::now()))
            .ok_or_else(ApiError::unauthorized)?;
        take(&rates.all)?;
        let scope = Scope::parse(&row.scope).ok_or_else(ApiError::unauthorized)?;
        let source = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map_or_else(|| "local".to_owned(), |c| c.0.ip().to_string());
        Ok(Self {
            who: Who {
                actor: format!("token:{} {}", row.id, row.name),
                source,
            },
            scope,
            rates,
        })
    }
}
