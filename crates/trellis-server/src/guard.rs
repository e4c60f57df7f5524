//! What every request passes before it reaches a handler.
//!
//! - **Token**: when the server has one, every request carries it, as `Authorization: Bearer TOKEN`, the
//!   `trellis_token` cookie, or `?token=TOKEN` (a browser's first visit; the answer then sets the cookie,
//!   `HttpOnly` and `SameSite=Strict`, so the app's own requests and event streams carry it).
//! - **Cross-site requests**: a state-changing request (anything but `GET`/`HEAD`/`OPTIONS`) is refused
//!   with `403` when a browser says it comes from another site (`Sec-Fetch-Site`), or its `Origin` is not
//!   this server. Their bodies are JSON, which a cross-site form cannot send without a preflight this
//!   server never grants.
//! - **Size**: request bodies are limited to [`MAX_BODY`] (`413` beyond).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::runs::Server;

/// The largest request body accepted: a workflow source fits many times over.
pub const MAX_BODY: usize = 4 << 20;

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

/// The middleware: token, then cross-site check.
pub async fn check(State(server): State<Arc<Server>>, request: Request, next: Next) -> Response {
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
