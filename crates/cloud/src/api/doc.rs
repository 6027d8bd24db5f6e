//! The API's OpenAPI 3.1 description, generated from the handlers and their types
//! (utoipa): never written by hand, served at `/api/v1/openapi.json`.

use utoipa::OpenApi as _;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};

#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "cyphonic cloud API",
        description = "The fleet, its devices and tunnels, its enrollment tokens, revocations, API tokens and audit log (docs/protocol.md §8)."
    ),
    paths(
        super::members,
        super::member,
        super::remove_member,
        super::revoke_member,
        super::reports::devices,
        super::reports::tunnels,
        super::flows::flows,
        super::enrollment_tokens,
        super::create_enrollment_token,
        super::revoke_enrollment_token,
        super::revocations,
        super::revoke_certificate,
        super::api_tokens,
        super::create_api_token,
        super::revoke_api_token,
        super::audit,
        super::policy,
        super::policy_check,
        super::member_policy,
        super::session::whoami,
    ),
    modifiers(&Bearer)
)]
struct Doc;

struct Bearer;

impl utoipa::Modify for Bearer {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The description, with the crate's version.
pub fn openapi() -> utoipa::openapi::OpenApi {
    let mut doc = Doc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_owned();
    doc
}
