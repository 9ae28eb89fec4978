//! One HTTP/1.1 connection to a cell's server over an in-memory pipe: hyper's server
//! (`server::conn::http1`, as `axum::serve` runs it) serving an axum `Router` on one end of a
//! `tokio::io::duplex`, a minimal client on the other, both on one current-thread runtime.
//!
//! Everything a request costs in user space is here (hyper parsing the request and writing the
//! response, axum routing, the layer, the handler, the runtime waking the connection's task),
//! and nothing else: no socket, no syscall, no second thread. So the instruction count of a
//! request is the same from run to run (`bench/examples/http_instructions.rs`, under callgrind), and
//! its time has none of loopback TCP's scheduling noise (`bench/benches/tower.rs`). A layer's
//! overhead measured here is an upper bound of its overhead in a real server, whose requests
//! also pay for the kernel's side of the socket.

use std::net::SocketAddr;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

#[path = "wire.rs"]
mod wire;
pub use wire::parse_head;

/// The request every call sends: a keep-alive `GET /`.
const REQUEST: &[u8] = b"GET / HTTP/1.1\r\nhost: bench\r\n\r\n";

/// A served connection and its client end.
pub struct Pipe {
    rt: tokio::runtime::Runtime,
    client: DuplexStream,
    buf: Vec<u8>,
}

impl Pipe {
    /// Serves `router` on a new in-memory connection from `peer`: every request carries
    /// `ConnectInfo(peer)`, as `into_make_service_with_connect_info` gives it over TCP.
    pub fn new(router: Router, peer: SocketAddr) -> Result<Pipe, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("a runtime: {e}"))?;
        let (client, server) = tokio::io::duplex(64 * 1024);
        let service = hyper::service::service_fn(move |mut req: hyper::Request<_>| {
            req.extensions_mut().insert(ConnectInfo(peer));
            // axum::serve clones the router for every request too.
            tower::Service::call(&mut router.clone(), req)
        });
        rt.spawn(serve(server, service));
        Ok(Pipe {
            rt,
            client,
            buf: vec![0; 4096],
        })
    }

    /// One request; its status once the whole response is read.
    pub fn request(&mut self) -> Result<u16, String> {
        self.requests(1)
    }

    /// `n` requests back to back, one in flight; the last one's status.
    pub fn requests(&mut self, n: u64) -> Result<u16, String> {
        let Pipe { rt, client, buf } = self;
        rt.block_on(async {
            let mut status = 0;
            for _ in 0..n {
                status = exchange(client, buf).await?;
            }
            Ok(status)
        })
    }
}

/// The server's end: hyper's HTTP/1.1 connection, as `axum::serve` runs one. A function of
/// its own so that callgrind can count the server's instructions apart from the client's
/// (`--toggle-collect='*pipe::serve*'`: polls of this future, and everything they call).
async fn serve<S>(io: DuplexStream, service: S)
where
    S: hyper::service::Service<
        hyper::Request<hyper::body::Incoming>,
        Response = axum::response::Response,
        Error = std::convert::Infallible,
    >,
{
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(io), service)
        .await;
}

/// Writes [`REQUEST`] and reads its response (one in flight: whatever arrives is its).
async fn exchange(client: &mut DuplexStream, buf: &mut Vec<u8>) -> Result<u16, String> {
    client
        .write_all(REQUEST)
        .await
        .map_err(|e| format!("writing the request: {e}"))?;
    let mut filled = 0;
    loop {
        if let Some((status, total)) = parse_head(&buf[..filled])? {
            match filled.cmp(&total) {
                std::cmp::Ordering::Equal => return Ok(status),
                std::cmp::Ordering::Greater => {
                    return Err("more bytes than the response's Content-Length".into())
                }
                std::cmp::Ordering::Less => {}
            }
        }
        if filled == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        match client.read(&mut buf[filled..]).await {
            Ok(0) => return Err("the server closed the connection".into()),
            Ok(n) => filled += n,
            Err(e) => return Err(format!("reading the response: {e}")),
        }
    }
}
