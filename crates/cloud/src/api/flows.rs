//! Flow records (docs/protocol.md §8, *Flow logs*), newest first.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use serde::Deserialize;

use super::{
    Answer, ApiError, ApiState, Caller, ErrorBody, Page, bad_cursor, key_of, page_limit, store_page,
};
use crate::admin::Scope;
use crate::store::{FlowQuery, FlowRow};

/// Which flow records: one member's, from or to one address, ended within a time.
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct FlowParams {
    /// Only those this member recorded.
    pub member: Option<String>,
    /// Only those from or to this address.
    pub address: Option<String>,
    /// Only those that ended at or after this (unix seconds).
    pub since: Option<u64>,
    /// Only those that ended at or before this (unix seconds).
    pub until: Option<u64>,
    /// At most this many (1-500, default 100).
    pub limit: Option<u32>,
    /// The cursor of the page before.
    pub after: Option<String>,
}

/// Flow records, newest first: flows that ended and summaries of refused ones.
#[utoipa::path(get, path = "/api/v1/flows", params(FlowParams),
    responses((status = 200, body = Page<FlowRow>), (status = 401, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub(super) async fn flows(
    State(s): State<Arc<ApiState>>,
    caller: Caller,
    q: Result<Query<FlowParams>, QueryRejection>,
) -> Answer<Page<FlowRow>> {
    caller.may(Scope::Read)?;
    let Query(q) = q?;
    let limit = page_limit(q.limit)?;
    let after = match q.after.as_deref().map(key_of).transpose()? {
        None => None,
        Some(k) => {
            let (end, id) = k.split_once(' ').ok_or_else(bad_cursor)?;
            Some((end.parse::<u64>().map_err(|_| bad_cursor())?, id.to_owned()))
        }
    };
    let address = q
        .address
        .map(|a| {
            a.parse::<std::net::IpAddr>()
                .map(|ip| ip.to_string())
                .map_err(|_| ApiError::invalid("address", format!("{a:?} is not an address")))
        })
        .transpose()?;
    let flows = s
        .nms
        .store()
        .flows_page(&FlowQuery {
            member: q
                .member
                .map(|m| m.trim_end_matches('.').to_ascii_lowercase()),
            address,
            since: q.since,
            until: q.until,
            after,
            limit: limit + 1,
        })
        .await?;
    Ok(Json(store_page(flows, limit, |f| {
        format!("{} {}", f.end, f.id)
    })))
}
