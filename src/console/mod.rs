//! The web console (`GET /`) and the browser SDK (`GET /sdk/signalling-client.js`): static
//! files embedded in the binary, so a server needs no web root. Each answer carries a strong
//! ETag (SHA-256 of the bytes) and is revalidated with `If-None-Match` (304).
//!
//! The console is a few ES modules: `app.js` (routes and views) imports `ui.js` (DOM, API,
//! who is signed in), `people.js` (requests for approval), `audit.js` and `estop.js`.
//!
//! The SDK file is the committed build of `clients/js` (CI checks it matches its source), so
//! `cargo build` needs no Node.js.

use std::sync::OnceLock;

use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::state::SharedState;

struct Asset {
    path: &'static str,
    content_type: &'static str,
    /// The console's pages change with the server; the SDK is safe to keep a few minutes.
    cache_control: &'static str,
    body: &'static [u8],
}

const PAGE: &str = "no-cache";
const STATIC: &str = "public, max-age=300";

static ASSETS: &[Asset] = &[
    Asset {
        path: "/",
        content_type: "text/html; charset=utf-8",
        cache_control: PAGE,
        body: include_bytes!("assets/index.html"),
    },
    Asset {
        path: "/console/app.js",
        content_type: "text/javascript; charset=utf-8",
        cache_control: PAGE,
        body: include_bytes!("assets/app.js"),
    },
    Asset {
        path: "/console/ui.js",
        content_type: "text/javascript; charset=utf-8",
        cache_control: PAGE,
        body: include_bytes!("assets/ui.js"),
    },
    Asset {
        path: "/console/people.js",
        content_type: "text/javascript; charset=utf-8",
        cache_control: PAGE,
        body: include_bytes!("assets/people.js"),
    },
    Asset {
        path: "/console/audit.js",
        content_type: "text/javascript; charset=utf-8",
        cache_control: PAGE,
        body: include_bytes!("assets/audit.js"),
    },
    Asset {
        path: "/console/estop.js",
        content_type: "text/javascript; charset=utf-8",
        cache_control: PAGE,
        body: include_bytes!("assets/estop.js"),
    },
    Asset {
        path: "/console/style.css",
        content_type: "text/css; charset=utf-8",
        cache_control: PAGE,
        body: include_bytes!("assets/style.css"),
    },
    Asset {
        path: "/console/favicon.svg",
        content_type: "image/svg+xml",
        cache_control: STATIC,
        body: include_bytes!("assets/favicon.svg"),
    },
    Asset {
        path: "/sdk/signalling-client.js",
        content_type: "text/javascript; charset=utf-8",
        cache_control: STATIC,
        body: include_bytes!("../../clients/js/dist/signalling-client.js"),
    },
    Asset {
        path: "/sdk/signalling-client.d.ts",
        content_type: "text/plain; charset=utf-8",
        cache_control: STATIC,
        body: include_bytes!("../../clients/js/dist/signalling-client.d.ts"),
    },
];

/// The console only talks to its own origin; media arrives over WebRTC.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   media-src 'self' blob: mediastream:; connect-src 'self' ws: wss:; \
                   object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'";

/// `"<first 32 hex digits of SHA-256>"` per asset, computed once.
fn etags() -> &'static [HeaderValue] {
    static ETAGS: OnceLock<Vec<HeaderValue>> = OnceLock::new();
    ETAGS.get_or_init(|| {
        ASSETS
            .iter()
            .map(|a| {
                let hash = crate::auth::sha256_hex(a.body);
                HeaderValue::from_str(&format!("\"{}\"", &hash[..32]))
                    .unwrap_or_else(|_| HeaderValue::from_static("\"0\""))
            })
            .collect()
    })
}

/// True when `If-None-Match` names this ETag (or `*`), weak or strong.
fn not_modified(headers: &HeaderMap, etag: &HeaderValue) -> bool {
    let Some(Ok(wanted)) = headers.get(header::IF_NONE_MATCH).map(|v| v.to_str()) else {
        return false;
    };
    let ours = etag.to_str().unwrap_or_default();
    wanted
        .split(',')
        .map(|t| t.trim().trim_start_matches("W/"))
        .any(|t| t == "*" || t == ours)
}

async fn serve(request: Request) -> Response {
    let path = request.uri().path();
    let Some(index) = ASSETS.iter().position(|a| a.path == path) else {
        return crate::api::ApiError::NotFound("no such route".into()).into_response();
    };
    let asset = &ASSETS[index];
    let etag = etags()[index].clone();
    let mut headers = HeaderMap::new();
    headers.insert(header::ETAG, etag.clone());
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static(asset.cache_control),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if asset.content_type.starts_with("text/html") {
        headers.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        );
        headers.insert(
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        );
        headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    }
    if not_modified(request.headers(), &etag) {
        return (StatusCode::NOT_MODIFIED, headers).into_response();
    }
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(asset.content_type),
    );
    (StatusCode::OK, headers, asset.body).into_response()
}

/// The console's and the SDK's routes, merged into the app at the top.
pub fn router() -> Router<SharedState> {
    ASSETS.iter().fold(Router::new(), |router, asset| {
        router.route(asset.path, get(serve))
    })
}
