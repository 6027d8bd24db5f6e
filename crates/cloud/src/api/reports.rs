//! What members report of themselves (docs/protocol.md §8, *Devices and tunnels*): an
//! adapter's devices, and the tunnels of the members online.

use std::net::IpAddr;
use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use serde::{Deserialize, Serialize};

use super::{
    Answer, ApiError, ApiState, Caller, ErrorBody, Page, PageQuery, bad_cursor, key_of, page_limit,
    store_page,
};
use crate::admin::Scope;
use crate::store::{DeviceRow, TunnelRow};

/// An adapter's devices as its last report gave them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct DevicePage {
    /// The certificate whose report this is: the member's online one, else the one that
    /// reported last.
    pub fingerprint: String,
    /// When that report came, unix seconds (none: it never reported).
    pub reported_at: Option<u64>,
    /// The devices, by address, at most `limit`.
    pub items: Vec<DeviceRow>,
    /// The cursor of the next page (`?after=`), None on the last.
    pub next: Option<String>,
}

/// A member's devices, by address (IPv4 first, as numbers).
#[utoipa::path(get, path = "/api/v1/members/{name}/devices",
    params(("name" = String, Path, description = "The member's name"), PageQuery),
    responses((status = 200, body = DevicePage), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub(super) async fn devices(
    State(s): State<Arc<ApiState>>,
    caller: Caller,
    name: Result<Path<String>, PathRejection>,
    q: Result<Query<PageQuery>, QueryRejection>,
) -> Answer<DevicePage> {
    let q = super::asked(&caller, Scope::Read, q)?;
    let Path(name) = name?;
    let limit = page_limit(q.limit)?;
    Ok(Json(
        device_page(&s, &name, q.after.as_deref(), limit).await?,
    ))
}

/// At most `limit` devices of the member `name` after the one `cursor` names.
pub(super) async fn device_page(
    s: &ApiState,
    name: &str,
    cursor: Option<&str>,
    limit: u32,
) -> Result<DevicePage, ApiError> {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    let after = cursor
        .map(|c| key_of(c)?.parse::<IpAddr>().map_err(|_| bad_cursor()))
        .transpose()?;
    let store = s.nms.store();
    let Some((fingerprint, reported_at)) = store.reporter(&name).await? else {
        return Err(ApiError::not_found(format!("no member named {name}")));
    };
    let devices = store
        .devices_page(&fingerprint, after.as_ref(), limit + 1)
        .await?;
    let Page { items, next } = store_page(devices, limit, |d| d.address.clone());
    Ok(DevicePage {
        fingerprint,
        reported_at,
        items,
        next,
    })
}

/// Which tunnels: those of one member, a page.
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct TunnelParams {
    /// Only those this member reported.
    pub member: Option<String>,
    /// At most this many (1-500, default 100).
    pub limit: Option<u32>,
    /// The cursor of the page before.
    pub after: Option<String>,
}

/// The tunnels members online reported, by member then peer: each pair twice, once from
/// each end that reported it.
#[utoipa::path(get, path = "/api/v1/tunnels", params(TunnelParams),
    responses((status = 200, body = Page<TunnelRow>), (status = 401, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub(super) async fn tunnels(
    State(s): State<Arc<ApiState>>,
    caller: Caller,
    q: Result<Query<TunnelParams>, QueryRejection>,
) -> Answer<Page<TunnelRow>> {
    caller.may(Scope::Read)?;
    let Query(q) = q?;
    let limit = page_limit(q.limit)?;
    Ok(Json(
        tunnel_page(&s, q.member.as_deref(), q.after.as_deref(), limit).await?,
    ))
}

/// At most `limit` tunnels (of the member `member`, or all) after the one `cursor` names.
pub(super) async fn tunnel_page(
    s: &ApiState,
    member: Option<&str>,
    cursor: Option<&str>,
    limit: u32,
) -> Result<Page<TunnelRow>, ApiError> {
    let member = member.map(|m| m.trim_end_matches('.').to_ascii_lowercase());
    let after = cursor.map(key_of).transpose()?;
    let after = match after.as_deref().map(|k| k.split(' ').collect::<Vec<_>>()) {
        None => None,
        Some(parts) => match parts[..] {
            [name, fp, peer] => Some((name, fp, peer)),
            _ => return Err(bad_cursor()),
        },
    };
    let tunnels = s
        .nms
        .store()
        .tunnels_page(member.as_deref(), after, limit + 1)
        .await?;
    Ok(store_page(tunnels, limit, |t| {
        format!(
            "{} {} {}",
            t.member, t.member_fingerprint, t.peer_fingerprint
        )
    }))
}
