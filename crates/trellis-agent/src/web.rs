//! The web tools (Fabro's of those names): `web_fetch`, a web page's text, and `web_search`, a
//! Brave Search query's results. Each is offered only when a node's `allowed_tools` names it, under
//! the permissions of `shell` (it reaches outside), and refused when the node cuts the network
//! (`sandbox="network=off"`) or the run cuts every stage's: the request is made by Trellis itself,
//! outside the sandbox that cuts it for commands. A page's HTML comes back as Markdown (scripts and
//! styles left out), other text as it is; a body is read up to `MAX_BODY` bytes, and known secret
//! values are redacted from what the model is shown. A search needs [`SEARCH_KEY`] in Trellis's
//! environment (the run checks it before its first stage); the key is sent to Brave only, and never
//! shown to the model or commands.

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
            "web_fetch is refused: this stage has no network (its node's sandbox=\"network=off\", or the run file's sandbox network)",
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

/// The variable holding the Brave Search API key `web_search` needs.
pub const SEARCH_KEY: &str = "BRAVE_SEARCH_API_KEY";
/// The variable naming another address for the Brave Search API (a proxy, a test's server).
const SEARCH_URL: &str = "BRAVE_SEARCH_BASE_URL";
const DEFAULT_SEARCH_URL: &str = "https://api.search.brave.com/res/v1";
/// How many results a search returns unless the model says otherwise, and the most it may.
const DEFAULT_RESULTS: u32 = 5;
const MAX_RESULTS: u32 = 20;
/// The most of an answer read (twenty results with their extra snippets are about 100 KB).
const MAX_SEARCH_ANSWER: usize = 2 * 1024 * 1024;

#[derive(Deserialize)]
struct SearchArgs {
    query: String,
    max_results: Option<u32>,
}

/// The part of Brave's answer the tool shows.
#[derive(Deserialize)]
struct SearchAnswer {
    #[serde(default)]
    web: Option<WebResults>,
}

#[derive(Deserialize)]
struct WebResults {
    #[serde(default)]
    results: Vec<SearchResult>,
}

#[derive(Deserialize)]
struct SearchResult {
    #[serde(default)]
    title: String,
    #[serde(default)]
    url: String,
    #[serde(default)]
    description: String,
}

/// Runs one `web_search` call under the node's sandbox `policy`.
pub(crate) async fn search(arguments: &Value, policy: &Policy) -> ToolOutput {
    let args: SearchArgs = match parse_args(Tool::WebSearch, arguments) {
        Ok(args) => args,
        Err(message) => return ToolOutput::error(message),
    };
    let query = args.query.trim();
    if query.is_empty() {
        return ToolOutput::error("web_search needs a query: what to search for");
    }
    if policy.network_off {
        return ToolOutput::error(
            "web_search is refused: this stage has no network (its node's sandbox=\"network=off\", or the run file's sandbox network)",
        );
    }
    let Some(key) = std::env::var(SEARCH_KEY)
        .ok()
        .filter(|k| !k.trim().is_empty())
    else {
        return ToolOutput::error(format!(
            "web_search cannot search: {SEARCH_KEY} is not set where Trellis runs"
        ));
    };
    let count = args
        .max_results
        .unwrap_or(DEFAULT_RESULTS)
        .clamp(1, MAX_RESULTS);
    let base = std::env::var(SEARCH_URL).unwrap_or_else(|_| DEFAULT_SEARCH_URL.to_owned());
    match tokio::time::timeout(DEFAULT_TIMEOUT, brave(&base, key.trim(), query, count)).await {
        Ok(Ok(shown)) => ToolOutput::ok(trellis_process::secrets::redact(&shown).into_owned()),
        Ok(Err(problem)) => {
            ToolOutput::error(trellis_process::secrets::redact(&problem).into_owned())
        }
        Err(_) => ToolOutput {
            note: Some("timed out".to_owned()),
            ..ToolOutput::error(format!(
                "Brave Search gave no answer within {} s",
                DEFAULT_TIMEOUT.as_secs()
            ))
        },
    }
}

/// Asks the Brave Search API at `base` for `count` results for `query`, shown numbered.
async fn brave(base: &str, key: &str, query: &str, count: u32) -> Result<String, String> {
    let url = reqwest::Url::parse_with_params(
        &format!("{}/web/search", base.trim_end_matches('/')),
        [("q", query), ("count", &count.to_string())],
    )
    .map_err(|e| format!("{SEARCH_URL} is not a URL: {e}"))?;
    let mut response = trellis_llm::http_client()
        .get(url)
        .header(reqwest::header::ACCEPT, "application/json")
        .header("X-Subscription-Token", key)
        .send()
        .await
        .map_err(|e| format!("Brave Search cannot be reached: {}", e.without_url()))?;
    let status = response.status();
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| e.to_string())? {
        bytes.extend_from_slice(&chunk);
        if bytes.len() > MAX_SEARCH_ANSWER {
            return Err(format!(
                "Brave Search's answer is longer than {} KB",
                MAX_SEARCH_ANSWER / 1024
            ));
        }
    }
    let body = String::from_utf8_lossy(&bytes);
    if !status.is_success() {
        let shown: String = body.chars().take(500).collect();
        return Err(format!("Brave Search answered {status}: {shown}"));
    }
    let answer: SearchAnswer = serde_json::from_str(&body)
        .map_err(|e| format!("Brave Search answered something other than results: {e}"))?;
    let results = answer.web.map(|w| w.results).unwrap_or_default();
    if results.is_empty() {
        return Ok(format!("No results for `{query}`."));
    }
    let mut shown = String::new();
    for (n, result) in results.iter().take(count as usize).enumerate() {
        let _ = writeln!(
            shown,
            "{}. {}\n   {}\n   {}",
            n + 1,
            plain(&result.title),
            result.url,
            plain(&result.description)
        );
    }
    shown.truncate(shown.trim_end().len());
    Ok(shown)
}

/// Brave's text with its markup (`<strong>` around the words searched for) as Markdown, on one line.
fn plain(text: &str) -> String {
    let markdown = htmd::convert(text).unwrap_or_else(|_| text.to_owned());
    markdown.split_whitespace().collect::<Vec<_>>().join(" ")
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

    /// A server on loopback that answers one request with `status` and `body`, and hands back
    /// the request's head (its line and headers).
    async fn brave_like(
        status: &'static str,
        body: &'static str,
    ) -> (String, tokio::task::JoinHandle<String>) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}/res/v1", listener.local_addr().unwrap());
        let served = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).await.unwrap() == 1 {
                head.push(byte[0]);
            }
            let answer = format!(
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            stream.write_all(answer.as_bytes()).await.unwrap();
            String::from_utf8_lossy(&head).into_owned()
        });
        (base, served)
    }

    /// The query and count go in Brave's parameters and the key in its header; the results come
    /// back numbered, their markup as Markdown on one line each.
    #[tokio::test]
    async fn a_search_asks_brave_and_numbers_its_results() {
        let (base, served) = brave_like(
            "200 OK",
            r#"{"type":"search","query":{"original":"rust async"},"web":{"type":"search","results":[
                {"title":"Async in <strong>Rust</strong>","url":"https://example.com/a","description":"Futures &amp; tasks,\n explained."},
                {"title":"Tokio","url":"https://tokio.rs/","description":"A runtime","extra_snippets":["x"]},
                {"title":"Third","url":"https://example.com/c","description":"more"}]}}"#,
        )
        .await;
        let shown = brave(&base, "k-123", "rust async & more", 2).await.unwrap();
        let head = served.await.unwrap().to_ascii_lowercase();
        assert!(
            head.starts_with("get /res/v1/web/search?q=rust+async+%26+more&count=2 http/1.1\r\n")
                && head.contains("\r\nx-subscription-token: k-123\r\n")
                && head.contains("\r\naccept: application/json\r\n"),
            "{head}"
        );
        assert_eq!(
            shown,
            "1. Async in **Rust**\n   https://example.com/a\n   Futures & tasks, explained.\n2. Tokio\n   https://tokio.rs/\n   A runtime"
        );

        let (base, _served) = brave_like("200 OK", r#"{"type":"search"}"#).await;
        assert_eq!(
            brave(&base, "k", "nothing", 5).await.unwrap(),
            "No results for `nothing`."
        );
        let (base, _served) =
            brave_like("401 Unauthorized", r#"{"error":{"detail":"bad token"}}"#).await;
        let refused = brave(&base, "k", "q", 5).await.unwrap_err();
        assert!(
            refused.starts_with("Brave Search answered 401 Unauthorized: {\"error\""),
            "{refused}"
        );
        let (base, _served) = brave_like("200 OK", "<html>").await;
        let garbled = brave(&base, "k", "q", 5).await.unwrap_err();
        assert!(garbled.starts_with("Brave Search answered something other than results"));
    }

    /// No query, no network, or no key: the model is told, and nothing is asked.
    #[tokio::test]
    async fn a_search_without_a_query_or_network_is_refused() {
        let open = Policy::default();
        let out = search(&json!({ "query": "  " }), &open).await;
        assert!(
            out.is_error && out.content.contains("needs a query"),
            "{}",
            out.content
        );
        let cut = Policy {
            network_off: true,
            ..Policy::default()
        };
        let out = search(&json!({ "query": "x" }), &cut).await;
        assert!(
            out.is_error && out.content.contains("network=off"),
            "{}",
            out.content
        );
        assert!(search(&json!({ "q": "x" }), &open).await.is_error);
    }
}
