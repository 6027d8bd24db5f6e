//! The console's policy page: the groups and rules in force, names that stand for nobody,
//! and the dry run (a read: a GET form, answered on the same page).

use std::collections::HashMap;
use std::sync::Arc;

use askama::Template;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;

use super::{Me, Person, shown_page};
use crate::admin::Scope;
use crate::api::{ApiError, ApiState, FlowQuestion};

/// A rule as the page shows it.
struct RuleLine {
    number: u32,
    from: String,
    to: String,
    allow: String,
}

/// A dry run's answer as the page shows it.
struct Answer {
    allowed: bool,
    because: String,
    rule: Option<u32>,
    src: String,
    dst: String,
}

#[derive(Template)]
#[template(path = "policy.html")]
struct PolicyPage {
    me: Option<Me>,
    page: &'static str,
    default: &'static str,
    groups: Vec<(String, String)>,
    rules: Vec<RuleLine>,
    unresolved: String,
    /// The question asked, to fill the form again.
    from: String,
    to: String,
    service: String,
    answer: Option<Answer>,
    /// Why the question could not be answered (an unknown name, a service that does not
    /// read).
    mistake: Option<String>,
}

pub(super) async fn policy(
    State(s): State<Arc<ApiState>>,
    p: Person,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let shown = async {
        p.0.may(Scope::Read)?;
        let view = crate::api::policy_view(&s);
        let asked = |k: &str| q.get(k).map(|v| v.trim().to_owned()).unwrap_or_default();
        let question = FlowQuestion {
            from: asked("from"),
            to: asked("to"),
            service: asked("service"),
        };
        let (answer, mistake) = if question.from.is_empty() && question.to.is_empty() {
            (None, None)
        } else {
            match crate::api::dry_run(&s, &question).await {
                Ok(a) => (
                    Some(Answer {
                        allowed: a.verdict.allowed,
                        because: a.verdict.because,
                        rule: a.verdict.rule.map(|r| r.number),
                        src: a.src,
                        dst: a.dst,
                    }),
                    None,
                ),
                // The registry's failure is the page's; a question that does not read is
                // answered on it.
                Err(e) if e.status == StatusCode::SERVICE_UNAVAILABLE => return Err(e),
                Err(e) => (None, Some(e.body.error.message)),
            }
        };
        Ok::<_, ApiError>(PolicyPage {
            me: Some(p.me()),
            page: "policy",
            default: view.default,
            groups: view
                .groups
                .into_iter()
                .map(|g| (g.name, g.members.join(", ")))
                .collect(),
            rules: view
                .rules
                .into_iter()
                .map(|r| RuleLine {
                    number: r.number,
                    from: r.from.join(", "),
                    to: r.to.join(", "),
                    allow: r.allow.join(", "),
                })
                .collect(),
            unresolved: view.unresolved.join(", "),
            from: question.from,
            to: question.to,
            service: question.service,
            answer,
            mistake,
        })
    }
    .await;
    shown_page(&p, shown, StatusCode::OK)
}
