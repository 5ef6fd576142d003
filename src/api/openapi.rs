//! The OpenAPI 3.1 document of the admin, enrollment and caller API, generated from the
//! handlers' annotations (utoipa) and served at `GET /v1/openapi.json`. CI checks the
//! running server against it with schemathesis.

use std::sync::OnceLock;

use axum::http::header;
use axum::response::IntoResponse;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::error::ErrorBody;
use super::{
    audit, confirmations, emergency, enroll, me, robots, sessions, signing_keys, tokens, views,
};

struct Security;

impl Modify for Security {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        let bearer = |what: &str| {
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(what.to_string()))
                    .build(),
            )
        };
        components.add_security_scheme(
            "admin",
            bearer("The admin token (--admin-token or the one logged at first start)"),
        );
        components.add_security_scheme(
            "client",
            bearer("A client token from POST /v1/tokens (sct_…) or a JWT"),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "signalling-server API",
        description = "Admin, enrollment and caller API of the robot signalling server. \
                       The WebSocket protocol at /ws is described in docs/protocol.md.",
        license(name = "MIT", identifier = "MIT")
    ),
    paths(
        enroll::enroll,
        signing_keys::list,
        robots::create,
        robots::list,
        robots::show,
        robots::key,
        robots::delete,
        robots::new_enrollment_token,
        robots::revoke,
        robots::grants,
        robots::put_grant,
        robots::delete_grant,
        tokens::create,
        tokens::list,
        tokens::revoke,
        sessions::list,
        audit::list,
        emergency::stop,
        me::me,
        me::robots,
        confirmations::list,
        confirmations::answer,
    ),
    components(schemas(ErrorBody, views::RoleName)),
    modifiers(&Security),
    tags(
        (name = "robots", description = "Robots, their credentials and grants (admin)"),
        (name = "tokens", description = "Client tokens (admin)"),
        (name = "sessions", description = "Session records (admin)"),
        (name = "enrollment", description = "A robot enrolls its key or CSR and pins the server's signing keys"),
        (name = "me", description = "The caller's own view (client token or JWT)"),
    )
)]
pub struct ApiDoc;

/// The document, rendered once.
pub fn document() -> &'static str {
    static DOC: OnceLock<String> = OnceLock::new();
    DOC.get_or_init(|| {
        // Built from static annotations only: it cannot fail at run time.
        ApiDoc::openapi()
            .to_json()
            .expect("the OpenAPI document serialises")
    })
}

pub async fn serve() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        document(),
    )
}
