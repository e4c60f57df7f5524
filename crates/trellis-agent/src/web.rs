//! `web_fetch`: a web page's text for the agent (Fabro's tool of that name). Offered only when a
//! node's `allowed_tools` names it, under the permissions of `shell` (it reaches outside), and
//! refused when the node cuts the network (`sandbox="network=off"`): the request is made by Trellis
//! itself, outside the sandbox that cuts it for commands. HTML comes back as Markdown (scripts and
//! styles left out), other text as it is; a body is read up to `MAX_BODY` bytes, and known secret
//! values are redacted from what the model is shown.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use trellis_process::sandbox::Policy;

use crate::tools::{Tool, ToolOutput, parse_args};

/// How long a fetch takes unless the model says otherwise, and the most it may.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
const MAX_TIMEOUT: Duration = Duration::from_mins(1);
/// The most of a body that is read.
const MAX_BODY: usize = 100 * 1024;

#[derive(Deserialize)]
struct Args {
    url: String,
    timeout_ms: Option<u64>,
}

/// Runs one `web_fetch` call under the node's sandbox `policy`.
pub(crate) async fn fetch(arguments: &Value, policy: &Policy) -> ToolOutput {
    let args: Args = match parse_args(Tool::WebFetch, arguments) {
        Ok(args) => args,
        Err(message) => return ToolOutput::error(message),
    };
    if policy.network_off {
        return ToolOutput::error(
            "web_fetch is refused: this node cuts the network (sandbox=\"network=off\")",
        );
    }
    let url = match reqwest::Url::parse(args.url.trim()) {
        Ok(url) if matches!(url.scheme(), "http" | "https") => url,
        Ok(url) => {
            return ToolOutput::error(format!(
                "web_fetch fetches http:// and https:// URLs, not {}:",
                url.scheme()
            ));
        }
        Err(e) => return ToolOutput::error(format!("`{}` is not a URL: {e}", args.url)),
    };
    let timeout = args
        .timeout_ms
        .map_or(DEFAULT_TIMEOUT, Duration::from_millis)
        .min(MAX_TIMEOUT);
    match tokio::time::timeout(timeout, get(url.clone())).await {
        Ok(Ok(text)) => ToolOutput::ok(trellis_process::secrets::redact(&text).into_owned()),
        Ok(Err(problem)) => ToolOutput::error(format!("{url}: {problem}")),
        Err(_) => ToolOutput {
            note: Some("timed out".to_owned()),
            ..ToolOutput::error(format!(
                "{url}: no answer within {} ms",
                timeout.as_millis()
            ))
        },
    }
}

/// The page at `url` as text.
async fn get(url: reqwest::Url) -> Result<String, String> {
    let mut response = trellis_llm::http_client()
        .get(url)
        .header(
            reqwest::header::ACCEPT,
            "text/html, text/*;q=0.9, */*;q=0.5",
        )
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let content_type = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase();
    let mut body = Vec::new();
    let mut cut = false;
    while let Some(chunk) = response.chunk().await.map_err(|e| e.to_string())? {
        let room = MAX_BODY - body.len();
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if chunk.len() > room {
            cut = true;
            break;
        }
    }
    if body.contains(&0) {
        return Err(format!(
            "the answer is not text ({})",
            if content_type.is_empty() {
                "no content type"
            } else {
                &content_type
            }
        ));
    }
    let text = String::from_utf8_lossy(&body);
    let html = content_type.contains("html")
        || (content_type.is_empty() && text.trim_start().starts_with('<'));
    let mut shown = if html {
        htmd::HtmlToMarkdown::builder()
            .skip_tags(vec!["script", "style", "noscript", "template"])
            .build()
            .convert(&text)
            .map_err(|e| format!("the page's HTML cannot be read: {e}"))?
    } else {
        text.into_owned()
    };
    if cut {
        let _ = write!(
            shown,
            "\n[… the page is longer than {} KB; the rest was not read]",
            MAX_BODY / 1024
        );
    }
    if status.is_success() {
        Ok(shown)
    } else {
        Err(format!("answered {status}\n{shown}"))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Nothing but http(s) is fetched, and nothing where the node cuts the network.
    #[tokio::test]
    async fn other_schemes_bad_urls_and_a_cut_network_are_refused() {
        let open = Policy::default();
        for (url, said) in [
            ("file:///etc/passwd", "not file:"),
            ("ftp://example.com/x", "not ftp:"),
            ("not a url", "is not a URL"),
        ] {
            let out = fetch(&json!({ "url": url }), &open).await;
            assert!(
                out.is_error && out.content.contains(said),
                "{url}: {}",
                out.content
            );
        }
        let cut = Policy {
            network_off: true,
            ..Policy::default()
        };
        let out = fetch(&json!({ "url": "http://127.0.0.1:1/" }), &cut).await;
        assert!(
            out.is_error && out.content.contains("network=off"),
            "{}",
            out.content
        );
        assert!(fetch(&json!({ "address": "x" }), &open).await.is_error);
    }
}
