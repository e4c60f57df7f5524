//! A free loopback port, for a server Trellis starts (the local model's) or a test starts.

/// A port on 127.0.0.1 that nothing listens on now (the system picks it; another process may still
/// take it before the caller binds it, which the caller's start must notice).
pub fn free_port() -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}
