//! What every request passes before it reaches a handler.
//!
//! - **Host**: the `Host` header must name the address the server listens on, `localhost`,
//!   `127.0.0.1`, `[::1]`, or a name given with `--allow-host`; anything else is `403` on every
//!   route. A web page on another site whose name an attacker points at 127.0.0.1 (DNS rebinding)
//!   sends its own name, and is refused. A server listening on every address (`0.0.0.0`, behind its
//!   token) accepts any name unless `--allow-host` lists them.
//! - **Token**: when the server has one, every request carries it, as `Authorization: Bearer TOKEN`, the
//!   `trellis_token` cookie, or `?token=TOKEN` (a browser's first visit; the answer then sets the cookie,
//!   `HttpOnly` and `SameSite=Strict`, so the app's own requests and event streams carry it).
//! - **Cross-site requests**: a state-changing request (anything but `GET`/`HEAD`/`OPTIONS`) is refused
//!   with `403` when a browser says it comes from another site (`Sec-Fetch-Site`), or its `Origin` is not
//!   this server. Their bodies are JSON, which a cross-site form cannot send without a preflight this
//!   server never grants.
//! - **Size and time**: a request body is read whole before its handler runs, limited to [`MAX_BODY`]
//!   (`413` beyond) and to [`BODY_TIMEOUT`] (`408` for a client that sends it too slowly).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::runs::Server;

/// The largest request body accepted: a workflow source fits many times over.
pub const MAX_BODY: usize = 4 << 20;
/// How long a client may take to send a request's body.
pub const BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The `Host` names a server accepts, or `None` for any (bound to every address, with a token, and no
/// `--allow-host`).
pub fn allowed_hosts(config: &crate::Config) -> Option<Vec<String>> {
    let ip = config.listen.ip();
    if ip.is_unspecified() && config.allow_hosts.is_empty() {
        return None;
    }
    let mut hosts: Vec<String> = ["localhost", "127.0.0.1", "::1"]
        .into_iter()
        .map(str::to_owned)
        .chain(config.allow_hosts.iter().map(|h| h.to_ascii_lowercase()))
        .collect();
    if !ip.is_unspecified() {
        hosts.push(ip.to_string());
    }
    Some(hosts)
}

/// The host name of a `Host` header value, without its port or an IPv6 address's brackets.
fn host_name(value: &str) -> &str {
    if let Some(rest) = value.strip_prefix('[') {
        return rest.split(']').next().unwrap_or_default();
    }
    value.rsplit_once(':').map_or(value, |(name, port)| {
        if port.bytes().all(|b| b.is_ascii_digit()) {
            name
        } else {
            value
        }
    })
}

/// Whether the request's `Host` names this server.
fn host_allowed(headers: &HeaderMap, allowed: &[String]) -> bool {
    headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(host_name)
        .is_some_and(|name| allowed.iter().any(|a| a.eq_ignore_ascii_case(name)))
}

const COOKIE: &str = "trellis_token";

fn refuse(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({ "error": message }))).into_response()
}

/// Compares without stopping at the first difference.
fn same(given: &str, expected: &str) -> bool {
    given.len() == expected.len()
        && given
            .bytes()
            .zip(expected.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

fn cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| pair.trim().strip_prefix(COOKIE)?.strip_prefix('='))
}

fn query_token(request: &Request) -> Option<String> {
    form_urlencoded::parse(request.uri().query()?.as_bytes())
        .find(|(key, _)| key == "token")
        .map(|(_, value)| value.into_owned())
}

/// Whether a browser says the request comes from another site.
fn cross_site(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok())
        && !matches!(site, "same-origin" | "none")
    {
        return true;
    }
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let origin_host = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .unwrap_or(origin);
    origin == "null" || !origin_host.eq_ignore_ascii_case(host)
}

/// The middleware: host, token, cross-site check, then the body read whole within its limits.
pub async fn check(State(server): State<Arc<Server>>, request: Request, next: Next) -> Response {
    if let Some(allowed) = &server.hosts
        && !host_allowed(request.headers(), allowed)
    {
        return refuse(
            StatusCode::FORBIDDEN,
            "this server does not answer to that host name; add it with --allow-host NAME",
        );
    }
    let mut set_cookie = None;
    if let Some(expected) = server.token.as_deref() {
        let headers = request.headers();
        let carried = bearer(headers).is_some_and(|t| same(t, expected))
            || cookie(headers).is_some_and(|t| same(t, expected));
        if !carried {
            match query_token(&request) {
                Some(token) if same(&token, expected) => set_cookie = Some(expected.to_owned()),
                _ => {
                    return refuse(
                        StatusCode::UNAUTHORIZED,
                        "this server needs its token: send `Authorization: Bearer TOKEN`, or open the app once with ?token=TOKEN",
                    );
                }
            }
        }
    }
    let safe = matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    );
    if !safe && cross_site(request.headers()) {
        return refuse(
            StatusCode::FORBIDDEN,
            "cross-site requests may not change anything on this server",
        );
    }
    let request = if safe {
        request
    } else {
        match read_body(request).await {
            Ok(request) => request,
            Err((status, message)) => return refuse(status, message),
        }
    };
    let mut response = next.run(request).await;
    if let Some(token) = set_cookie
        && let Ok(value) = HeaderValue::from_str(&format!(
            "{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict"
        ))
    {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

/// The request with its body read whole, within [`MAX_BODY`] and [`BODY_TIMEOUT`]; or the status
/// and message to refuse it with.
async fn read_body(request: Request) -> Result<Request, (StatusCode, &'static str)> {
    let (parts, body) = request.into_parts();
    match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, MAX_BODY)).await {
        Ok(Ok(bytes)) => Ok(Request::from_parts(parts, axum::body::Body::from(bytes))),
        Ok(Err(_)) => Err((
            StatusCode::PAYLOAD_TOO_LARGE,
            "the request body is larger than 4 MiB, or was cut off",
        )),
        Err(_) => Err((
            StatusCode::REQUEST_TIMEOUT,
            "the request body took too long to arrive",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn host_names_are_read_without_their_port() {
        assert_eq!(host_name("127.0.0.1:7777"), "127.0.0.1");
        assert_eq!(host_name("localhost"), "localhost");
        assert_eq!(host_name("[::1]:7777"), "::1");
        assert_eq!(host_name("x.test:80"), "x.test");
        let allowed = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        assert!(host_allowed(&headers(&[("host", "LOCALHOST:1")]), &allowed));
        assert!(!host_allowed(
            &headers(&[("host", "x.test:7777")]),
            &allowed
        ));
        assert!(!host_allowed(&headers(&[]), &allowed), "no Host at all");
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(same("abc", "abc"));
        assert!(!same("abd", "abc"));
        assert!(!same("ab", "abc"));
        assert!(!same("", "abc"));
    }

    #[test]
    fn the_token_is_found_in_a_bearer_header_or_among_cookies() {
        assert_eq!(
            bearer(&headers(&[("authorization", "Bearer t0k")])),
            Some("t0k")
        );
        assert_eq!(bearer(&headers(&[("authorization", "Basic t0k")])), None);
        let jar = headers(&[("cookie", "a=1; trellis_token=t0k; b=2")]);
        assert_eq!(cookie(&jar), Some("t0k"));
        assert_eq!(cookie(&headers(&[("cookie", "trellis_tokenx=1")])), None);
    }

    #[test]
    fn query_tokens_are_percent_decoded() {
        let request = |uri: &str| {
            Request::builder()
                .uri(uri)
                .body(axum::body::Body::empty())
                .unwrap()
        };
        assert_eq!(
            query_token(&request("/?a=1&token=s3%2Bcr%20t")).as_deref(),
            Some("s3+cr t")
        );
        assert_eq!(query_token(&request("/?tokens=x")), None);
        assert_eq!(query_token(&request("/")), None);
    }

    #[test]
    fn a_request_from_another_site_is_told_apart() {
        let host = ("host", "127.0.0.1:7777");
        assert!(
            !cross_site(&headers(&[host])),
            "no origin: not a browser's cross-site request"
        );
        assert!(!cross_site(&headers(&[
            host,
            ("origin", "http://127.0.0.1:7777")
        ])));
        assert!(cross_site(&headers(&[
            host,
            ("origin", "http://evil.example")
        ])));
        assert!(cross_site(&headers(&[host, ("origin", "null")])));
        assert!(cross_site(&headers(&[
            host,
            ("sec-fetch-site", "cross-site")
        ])));
        assert!(!cross_site(&headers(&[
            host,
            ("sec-fetch-site", "same-origin")
        ])));
    }
}
