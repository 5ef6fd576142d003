//! The `Origin` check of the remote MCP endpoint (MCP 2025-06-18, Streamable HTTP, "Security
//! Warning": servers MUST validate `Origin`, against DNS rebinding; `crate::mcp` runs it as a
//! layer), and of the ARP gateway's upgrade (`crate::arp`: browsers let any page open a
//! WebSocket to any address). It runs on every request to either before anything else (before the token is looked at, before
//! any MCP exchange): a request without `Origin` (a program: MCP hosts, SDKs, curl) passes; a
//! browser's passes only from the server's own origin or one listed with `--allow-origin`;
//! anything else is 403 in the API's JSON error shape.
//!
//! "Own origin" is a page served from the very address the request came to, and only when
//! that address is an IP literal or `localhost`: a DNS name cannot count, because under DNS
//! rebinding the attacker's page and its requests carry the attacker's name in both `Origin`
//! and `Host`. A server reached by name lists that name's origin.

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;

use crate::http_error;

/// The answer to a request from a web origin not allowed: 403 in the API's JSON shape.
pub fn refused() -> Response {
    http_error::response(
        StatusCode::FORBIDDEN,
        "FORBIDDEN",
        "requests from this web page's origin are refused (DNS rebinding protection); \
         the server's operator may allow it with --allow-origin",
    )
}

/// An origin as compared: lower case, no surrounding space, no trailing slash.
pub fn normalise(origin: &str) -> String {
    origin.trim().trim_end_matches('/').to_ascii_lowercase()
}

/// `--allow-origin`'s parser: `scheme://host[:port]`, nothing after it; kept normalised.
pub fn parse_allowed(origin: &str) -> Result<String, String> {
    let normal = normalise(origin);
    let valid = normal.split_once("://").is_some_and(|(scheme, host)| {
        matches!(scheme, "http" | "https")
            && !host.is_empty()
            && !host.contains(['/', '?', '#', '@', ' ', '*'])
    });
    if valid {
        Ok(normal)
    } else {
        Err(format!(
            "{origin:?} is not an origin: write http(s)://host[:port], no path"
        ))
    }
}

/// Whether a request may come from where it says: no `Origin` (not a browser), the server's
/// own, or one listed. Several `Origin` headers, `null` or an unreadable one are refused.
pub fn allowed(headers: &HeaderMap, listed: &[String]) -> bool {
    let mut values = headers.get_all(header::ORIGIN).iter();
    let Some(value) = values.next() else {
        return true;
    };
    if values.next().is_some() {
        return false;
    }
    let Ok(origin) = value.to_str() else {
        return false;
    };
    let origin = normalise(origin);
    listed.iter().any(|l| normalise(l) == origin) || own(&origin, headers)
}

/// A page served from the address this request came to (`Host`), where that address cannot
/// be rebound: an IP literal or `localhost`.
fn own(origin: &str, headers: &HeaderMap) -> bool {
    let Some(authority) = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
    else {
        return false;
    };
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return false;
    };
    authority == host.trim().to_ascii_lowercase() && cannot_be_rebound(authority)
}

/// `host[:port]` names an IP address or `localhost` (which browsers resolve to loopback
/// themselves), not a DNS name someone else controls.
fn cannot_be_rebound(authority: &str) -> bool {
    let host = if let Some(rest) = authority.strip_prefix('[') {
        // [v6]:port
        rest.split(']').next().unwrap_or("")
    } else {
        authority
            .rsplit_once(':')
            .map_or(authority, |(host, _port)| host)
    };
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(origin: Option<&str>, host: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_str(host).unwrap());
        if let Some(o) = origin {
            h.insert(header::ORIGIN, HeaderValue::from_str(o).unwrap());
        }
        h
    }

    #[test]
    fn programs_pass_and_pages_need_an_allowed_origin() {
        let listed = vec!["https://console.example.com".to_string()];
        let ok = |origin, host| allowed(&headers(origin, host), &listed);
        assert!(ok(None, "fleet.example.com"));
        assert!(ok(
            Some("https://Console.example.com/"),
            "fleet.example.com"
        ));
        assert!(!ok(Some("https://evil.example"), "fleet.example.com"));
        assert!(!ok(Some("null"), "127.0.0.1:8080"));
        // Own origin: an IP literal or localhost, the same address as Host.
        assert!(ok(Some("http://127.0.0.1:8080"), "127.0.0.1:8080"));
        assert!(ok(Some("http://[::1]:8080"), "[::1]:8080"));
        assert!(ok(Some("http://localhost:8080"), "localhost:8080"));
        assert!(!ok(Some("http://127.0.0.1:9999"), "127.0.0.1:8080"));
        // DNS rebinding: the attacker's name in both headers is still refused.
        assert!(!ok(Some("http://rebind.evil:8080"), "rebind.evil:8080"));
        let mut two = headers(Some("http://127.0.0.1:8080"), "127.0.0.1:8080");
        two.append(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8080"),
        );
        assert!(!allowed(&two, &listed));
    }

    #[test]
    fn allow_origin_takes_origins_only() {
        assert_eq!(
            parse_allowed("HTTPS://Console.Example.com/").as_deref(),
            Ok("https://console.example.com")
        );
        assert!(parse_allowed("http://localhost:6274").is_ok());
        for bad in [
            "console.example.com",
            "https://h/path",
            "*",
            "ftp://h",
            "https://",
        ] {
            assert!(parse_allowed(bad).is_err(), "{bad}");
        }
        // The flag itself: a malformed origin stops the start; a list is comma separated.
        let parse = |v: &str| crate::Config::from_args(["signalling-server", "--allow-origin", v]);
        assert!(parse("console.example.com").is_err());
        let config = parse("https://A.example,http://b.example:8080").expect("config");
        assert_eq!(
            config.allow_origins,
            ["https://a.example", "http://b.example:8080"]
        );
    }
}
