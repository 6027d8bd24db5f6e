//! The console's pages of who may reach what: API tokens (admins only: made, shown once,
//! revoked) and the certificates revoked online.

use std::sync::Arc;

use askama::Template;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;

use super::{CsrfForm, Made, Me, Person, changed, error_page, may_change, shown_page, when};
use crate::admin::{self, Scope};
use crate::api::{ApiError, ApiState, ApiTokenView, now};

/// An API token as the page shows it.
struct ApiTokenLine {
    id: String,
    name: String,
    scope: String,
    state: &'static str,
    made: String,
    by: String,
    ends: String,
}

impl ApiTokenLine {
    fn of(v: ApiTokenView) -> Self {
        Self {
            made: when(v.created_at),
            ends: v.expires_at.map_or_else(|| "never".to_owned(), when),
            id: v.id,
            name: v.name,
            scope: v.scope,
            state: v.state,
            by: v.created_by,
        }
    }
}

#[derive(Template)]
#[template(path = "api_tokens.html")]
struct ApiTokens {
    me: Option<Me>,
    page: &'static str,
    tokens: Vec<ApiTokenLine>,
    made: Option<Made>,
    csrf: String,
}

async fn api_tokens_page(s: &ApiState, p: &Person, made: Option<Made>) -> Response {
    let shown = async {
        p.0.may(Scope::Admin)?;
        let tokens = crate::api::api_token_views(s)
            .await?
            .into_iter()
            .map(ApiTokenLine::of)
            .collect();
        let me = p.me();
        Ok::<_, ApiError>(ApiTokens {
            page: "api-tokens",
            tokens,
            made,
            csrf: me.csrf.clone(),
            me: Some(me),
        })
    }
    .await;
    // A token made and shown is a page created.
    let status = match &shown {
        Ok(t) if t.made.is_some() => StatusCode::CREATED,
        _ => StatusCode::OK,
    };
    shown_page(p, shown, status)
}

pub(super) async fn api_tokens(State(s): State<Arc<ApiState>>, p: Person) -> Response {
    api_tokens_page(&s, &p, None).await
}

/// The API token form: a name, a scope, days until it ends (empty: never).
#[derive(Debug, Deserialize)]
pub(super) struct ApiTokenForm {
    #[serde(default)]
    csrf: String,
    name: String,
    scope: String,
    #[serde(default)]
    days: String,
}

pub(super) async fn make_api_token(
    State(s): State<Arc<ApiState>>,
    p: Person,
    axum::Form(form): axum::Form<ApiTokenForm>,
) -> Response {
    let made = async {
        let csrf = CsrfForm {
            csrf: form.csrf.clone(),
        };
        may_change(&s, &p, &csrf, "api_token.create", "").await?;
        let scope = Scope::parse(form.scope.trim()).ok_or_else(|| {
            ApiError::invalid(
                "scope",
                format!("{:?} is not read, write or admin", form.scope),
            )
        })?;
        let expires = match form.days.trim() {
            "" => None,
            d => Some(
                d.parse::<u64>()
                    .ok()
                    .filter(|d| (1..=365).contains(d))
                    .ok_or_else(|| {
                        ApiError::invalid("days", format!("{d:?}: give 1 to 365 days, or none"))
                    })?
                    * 86_400,
            ),
        };
        let (row, token) = admin::create_api_token(
            s.nms.store(),
            form.name.trim(),
            scope,
            expires,
            &p.0.who,
            now(),
        )
        .await?;
        s.refresh().await?;
        Ok::<_, ApiError>(Made {
            name: row.name,
            token: token.to_string(),
        })
    }
    .await;
    match made {
        Ok(m) => api_tokens_page(&s, &p, Some(m)).await,
        Err(e) => error_page(Some(p.me()), e),
    }
}

pub(super) async fn revoke_api_token(
    State(s): State<Arc<ApiState>>,
    p: Person,
    Path(id): Path<String>,
    axum::Form(form): axum::Form<CsrfForm>,
) -> Response {
    let done = async {
        may_change(&s, &p, &form, "api_token.revoke", &id).await?;
        admin::revoke_api_token(s.nms.store(), &id, &p.0.who, now()).await?;
        s.refresh().await?;
        Ok::<_, ApiError>(())
    }
    .await;
    changed(&p, done, "/console/api-tokens")
}

/// A revocation as the page shows it.
struct RevocationLine {
    fingerprint: String,
    name: String,
    when: String,
}

#[derive(Template)]
#[template(path = "revocations.html")]
struct Revocations {
    me: Option<Me>,
    page: &'static str,
    revocations: Vec<RevocationLine>,
}

pub(super) async fn revocations(State(s): State<Arc<ApiState>>, p: Person) -> Response {
    let shown = async {
        p.0.may(Scope::Read)?;
        let revocations = s
            .nms
            .store()
            .revocation_rows()
            .await?
            .into_iter()
            .map(|(fingerprint, name, at)| RevocationLine {
                fingerprint,
                name,
                when: when(at),
            })
            .collect();
        Ok::<_, ApiError>(Revocations {
            me: Some(p.me()),
            page: "revocations",
            revocations,
        })
    }
    .await;
    shown_page(&p, shown, StatusCode::OK)
}
