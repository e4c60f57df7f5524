//! A plain HTTP/1.1 client over a TCP socket, for end-to-end tests of `trellis serve`: requests are sent
//! byte for byte as written (a path with `..` or `%2F` reaches the server unnormalized, as an attacker's
//! would), and Server-Sent Events are read as they arrive.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::Value;

/// A loopback port nobody listens on now.
pub fn free_port() -> u16 {
    trellis_process::port::free_port().expect("a free port")
}

/// Starts a server on a free loopback port and returns it once it is ours and ready: `start(port)`
/// spawns it, `ready(port)` says whether it serves. A port found free may be taken by another
/// test's server before this one binds it — then this one exits or stays without the port while
/// the other answers — so the server counts as started only when its own process holds a
/// listening socket on the port; else it is stopped and started on another port (five in all).
/// Panics naming `what` when it is not ready within `patience` on a port it holds.
pub fn start_on_free_port(
    what: &str,
    patience: Duration,
    mut start: impl FnMut(u16) -> std::process::Child,
    ready: impl Fn(u16) -> bool,
) -> (std::process::Child, u16) {
    for _ in 0..5 {
        let port = free_port();
        let mut child = start(port);
        let deadline = std::time::Instant::now() + patience;
        loop {
            if matches!(child.try_wait(), Ok(Some(_))) {
                break;
            }
            if ready(port) && listens(child.id(), port) {
                return (child, port);
            }
            if std::time::Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                if listens_anyone(port) {
                    // Another test's server answered: try another port.
                    break;
                }
                panic!("{what} did not start within {patience:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("{what} could not hold a port in five tries");
}

/// The inodes of the sockets listening on loopback `port` (from `/proc/net/tcp` and `tcp6`).
fn listening_sockets(port: u16) -> Vec<String> {
    let wanted = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .flat_map(|table| {
            table
                .lines()
                .skip(1)
                .filter_map(|line| {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    // local address, state (0A: listening), inode
                    (fields.len() > 9 && fields[1].ends_with(&wanted) && fields[3] == "0A")
                        .then(|| format!("socket:[{}]", fields[9]))
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

fn listens_anyone(port: u16) -> bool {
    !listening_sockets(port).is_empty()
}

/// Whether the process `pid` holds a socket listening on `port`.
fn listens(pid: u32, port: u16) -> bool {
    let sockets = listening_sockets(port);
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .any(|target| sockets.iter().any(|s| target.as_os_str() == s.as_str()))
}

/// Waits until something accepts connections on loopback `port`; panics naming `what` after 20 s.
pub fn wait_for_port(port: u16, what: &str) {
    let started = std::time::Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{what} did not start within 20 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An answer: status, headers (names lower-cased) and body.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON (panics with the body when it is not).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}), status {}: {}", self.status, self.text()))
    }
}

/// A request to a server on 127.0.0.1.
pub struct Request<'a> {
    pub port: u16,
    pub method: &'a str,
    pub path: &'a str,
    pub headers: Vec<(&'a str, String)>,
    pub body: Option<Vec<u8>>,
    /// How long a read of the answer may wait (a minute unless said).
    pub timeout: Duration,
}

impl<'a> Request<'a> {
    pub fn new(port: u16, method: &'a str, path: &'a str) -> Self {
        Self {
            port,
            method,
            path,
            headers: Vec::new(),
            body: None,
            timeout: Duration::from_mins(1),
        }
    }

    /// How long a read of the answer may wait.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    #[must_use]
    pub fn header(mut self, name: &'a str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    /// A JSON body (with its content type).
    #[must_use]
    pub fn json(mut self, body: &Value) -> Self {
        self.headers
            .push(("Content-Type", "application/json".to_owned()));
        self.body = Some(body.to_string().into_bytes());
        self
    }

    #[must_use]
    pub fn body(mut self, bytes: Vec<u8>) -> Self {
        self.body = Some(bytes);
        self
    }

    fn connect(&self) -> std::io::Result<TcpStream> {
        let stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(self.timeout))?;
        let mut head = format!(
            "{} {} HTTP/1.1\r\nConnection: close\r\n",
            self.method, self.path
        );
        // The server's own address, unless the test names another host.
        if !self
            .headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("host"))
        {
            let _ = write!(head, "Host: 127.0.0.1:{}\r\n", self.port);
        }
        for (name, value) in &self.headers {
            let _ = write!(head, "{name}: {value}\r\n");
        }
        let body = self.body.clone().unwrap_or_default();
        if self.body.is_some() || self.method != "GET" {
            let _ = write!(head, "Content-Length: {}\r\n", body.len());
        }
        head.push_str("\r\n");
        let mut writer = stream.try_clone()?;
        writer.write_all(head.as_bytes())?;
        // A server may answer (413) before it has read a large body; the answer still counts.
        let _ = writer.write_all(&body);
        Ok(stream)
    }

    /// Sends the request and reads the answer's status and headers, leaving the body to read.
    fn head(&self) -> std::io::Result<(BufReader<TcpStream>, u16, Headers)> {
        let mut reader = BufReader::new(self.connect()?);
        let (status, headers) = read_head(&mut reader)?;
        Ok((reader, status, headers))
    }

    /// Sends the request and reads the whole answer; panics when the server cannot be reached or
    /// answers no HTTP.
    pub fn send(self) -> Response {
        self.try_send()
            .unwrap_or_else(|e| panic!("no answer from 127.0.0.1:{}: {e}", self.port))
    }

    /// Sends the request and reads the whole answer, or says why there is none (nothing listens,
    /// the connection was reset, what came back is no HTTP): for probes of a server that may not
    /// be up yet.
    pub fn try_send(&self) -> std::io::Result<Response> {
        let (mut reader, status, headers) = self.head()?;
        let chunked = chunked(&headers);
        let length = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .and_then(|(_, v)| v.trim().parse::<u64>().ok());
        let mut body = Vec::new();
        if chunked {
            let _ = Chunked::new(reader).read_to_end(&mut body);
        } else if let Some(length) = length {
            // What the server said it sends: a server that keeps the connection open despite
            // `Connection: close` is not waited on until the read times out.
            let _ = reader.take(length).read_to_end(&mut body);
        } else {
            let _ = reader.read_to_end(&mut body);
        }
        Ok(Response {
            status,
            headers,
            body,
        })
    }

    /// Sends the request and returns the open event stream.
    pub fn stream(self) -> EventStream {
        let (reader, status, headers) = self
            .head()
            .unwrap_or_else(|e| panic!("no answer from 127.0.0.1:{}: {e}", self.port));
        let body: Box<dyn Read + Send> = if chunked(&headers) {
            Box::new(Chunked::new(reader))
        } else {
            Box::new(reader)
        };
        EventStream {
            status,
            lines: BufReader::new(body),
        }
    }
}

/// Whether the body comes in chunks.
fn chunked(headers: &[(String, String)]) -> bool {
    headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"))
}

/// An answer's headers, names lower-cased.
type Headers = Vec<(String, String)>;

fn read_head(reader: &mut impl BufRead) -> std::io::Result<(u16, Headers)> {
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("not an HTTP status line: {line:?}"),
            )
        })?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line)?;
        let trimmed = line.trim_end();
        if trimmed.is_empty() {
            break;
        }
        if let Some((name, value)) = trimmed.split_once(':') {
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
    }
    Ok((status, headers))
}

/// Decodes a chunked body.
struct Chunked<R> {
    inner: R,
    left: usize,
    done: bool,
}

impl<R: BufRead> Chunked<R> {
    fn new(inner: R) -> Self {
        Self {
            inner,
            left: 0,
            done: false,
        }
    }
}

impl<R: BufRead> Read for Chunked<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.done {
            return Ok(0);
        }
        if self.left == 0 {
            let mut size = String::new();
            if self.inner.read_line(&mut size)? == 0 {
                self.done = true;
                return Ok(0);
            }
            let size = size.trim();
            if size.is_empty() {
                // The line break after the previous chunk.
                return self.read(buf);
            }
            let size = usize::from_str_radix(size.split(';').next().unwrap_or("0"), 16)
                .map_err(std::io::Error::other)?;
            if size == 0 {
                self.done = true;
                return Ok(0);
            }
            self.left = size;
        }
        let wanted = buf.len().min(self.left);
        let read = self.inner.read(&mut buf[..wanted])?;
        if read == 0 {
            self.done = true;
        }
        self.left -= read;
        Ok(read)
    }
}

/// One Server-Sent Event.
#[derive(Debug, Clone, Default)]
pub struct SseEvent {
    pub id: Option<String>,
    /// The event type (`message` when none was given).
    pub event: String,
    pub data: String,
}

impl SseEvent {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap_or(Value::Null)
    }
}

/// An open `text/event-stream`.
pub struct EventStream {
    pub status: u16,
    lines: BufReader<Box<dyn Read + Send>>,
}

impl Iterator for EventStream {
    type Item = SseEvent;

    /// The next event (comments and keep-alives skipped); `None` when the stream ends.
    fn next(&mut self) -> Option<SseEvent> {
        let mut event = SseEvent::default();
        let mut any = false;
        loop {
            let mut line = String::new();
            if self.lines.read_line(&mut line).ok()? == 0 {
                return None;
            }
            let line = line.trim_end_matches(['\r', '\n']);
            if line.is_empty() {
                if any {
                    if event.event.is_empty() {
                        "message".clone_into(&mut event.event);
                    }
                    return Some(event);
                }
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "id" => event.id = Some(value.to_owned()),
                "event" => value.clone_into(&mut event.event),
                "data" => {
                    if !event.data.is_empty() {
                        event.data.push('\n');
                    }
                    event.data.push_str(value);
                }
                _ => continue,
            }
            any = true;
        }
    }
}
