//! The `redis-server` the Redis examples start for themselves (`redis.rs`, `fleet.rs`): on a
//! free loopback port (never 6379), with no persistence, in a temporary directory, killed on
//! drop.

use std::io::Write;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` this example started: killed (and its directory removed) on drop.
pub struct Server {
    pub port: u16,
    pub child: Child,
    dir: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A free loopback port, never 6379: bind port 0, read it, release it.
fn free_port() -> std::io::Result<u16> {
    loop {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        if port != 6379 {
            return Ok(port);
        }
    }
}

/// Whether a server on `port` answers `PING`.
fn answers_ping(port: u16) -> bool {
    let Ok(mut s) =
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200))
    else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 16];
    let n = std::io::Read::read(&mut s, &mut buf).unwrap_or(0);
    let _ = s.shutdown(Shutdown::Both);
    buf[..n].starts_with(b"+PONG")
}

/// Starts `redis-server` on a free loopback port with no persistence, waiting until it
/// answers. `Err` carries the message to print; `Ok(None)` means it is not installed.
pub fn start_server() -> Result<Option<Server>, String> {
    let installed = Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !installed {
        return Ok(None);
    }
    let port = free_port().map_err(|e| format!("finding a free port: {e}"))?;
    let dir = std::env::temp_dir().join(format!(
        "turnstile-redis-example-{}-{port}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .args(["--protected-mode", "no", "--loglevel", "warning"])
        .arg("--dir")
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting redis-server: {e}"))?;
    // From here the handle owns the process: every return below kills it.
    let mut server = Server { port, child, dir };
    let start = Instant::now();
    while !answers_ping(port) {
        if let Ok(Some(status)) = server.child.try_wait() {
            return Err(format!(
                "redis-server exited ({status}) before answering on port {port}"
            ));
        }
        if start.elapsed() > Duration::from_secs(10) {
            return Err(format!(
                "redis-server did not answer on port {port} within 10 s"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(Some(server))
}
