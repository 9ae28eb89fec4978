//! The measurement binary behind `scripts/instructions`' HTTP cells: serves one cell's axum
//! router (`bench/examples/http/cells.rs`, the servers of `bench/examples/http.rs`) on an in-memory
//! connection (`bench/examples/http/pipe.rs`: hyper's HTTP/1.1 server, axum, the layer, the handler,
//! all in user space on one thread), then sends `ops` requests through it in [`measured`]. On
//! its own it measures nothing; the script runs it under callgrind, counting only inside
//! `measured`, with two op counts, and divides the difference of the totals by the difference
//! of the op counts: the instructions of one whole request, client end included.
//!
//! ```text
//! cargo run --release -p turnstile-bench --example http_instructions -- <cell> <none|pass-through|turnstile|turnstile-inline|governor> <ops>
//! ```
//!
//! Cells:
//! * `http-allow`: a layer keyed by peer IP that allows every request (`turnstile_router`,
//!   `governor_allow_router`); `none` serves the router without a layer (`no_layer_router`).
//! * `http-deny`: a layer keyed by peer IP that refuses all but the first request
//!   (`turnstile_deny_router`, `governor_deny_router`: 429 with `Retry-After`; turnstile's
//!   also with the `RateLimit` headers, its default); `none` as in `http-allow`.
//! * `http-deny-bare`: the same, turnstile's layer without the `RateLimit` headers
//!   (`Headers::Never`: `Retry-After` only; tower_governor's default refusal sends
//!   `Retry-After` and `x-ratelimit-after`).
//!
//! `turnstile-inline` is turnstile's layer over the inline per-key map (`KeyedTokenBucket`)
//! instead of a `Keyed` map, in every cell (`turnstile_inline_router`,
//! `turnstile_inline_deny_router`, `turnstile_inline_deny_bare_router`). `pass-through`
//! (`http-allow` only) is a layer that calls the inner service and nothing else
//! (`pass_through_router`): what any layer costs under axum's `Router::layer`.
//!
//! One request is sent before the measured loop (the peer's first, which even the denying
//! layers allow: the limiter's key is created then, outside the figures), and the binary
//! fails unless the last measured request got the status the cell is for.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;

use axum::Router;

#[path = "http/cells.rs"]
mod cells;
#[path = "http/pipe.rs"]
mod pipe;

/// The peer every request comes from.
const PEER: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 40_000);

/// The measured loop: `ops` requests on `pipe`. Never inlined, so that callgrind can count
/// this function (and everything it calls) and nothing else (`--toggle-collect`).
#[inline(never)]
fn measured(pipe: &mut pipe::Pipe, ops: u64) -> Result<u16, String> {
    pipe.requests(ops)
}

/// The cell's router and the status its measured requests must get.
fn router(cell: &str, imp: &str) -> Result<(Router, u16), String> {
    let built = match (cell, imp) {
        ("http-allow" | "http-deny" | "http-deny-bare", "none") => {
            cells::no_layer_router().map(|r| (r, 200))
        }
        ("http-allow", "turnstile") => cells::turnstile_router().map(|r| (r, 200)),
        ("http-allow", "governor") => cells::governor_allow_router().map(|r| (r, 200)),
        ("http-deny", "turnstile") => cells::turnstile_deny_router().map(|r| (r, 429)),
        ("http-deny" | "http-deny-bare", "governor") => {
            cells::governor_deny_router().map(|r| (r, 429))
        }
        ("http-deny-bare", "turnstile") => cells::turnstile_deny_bare_router().map(|r| (r, 429)),
        ("http-allow", "pass-through") => cells::pass_through_router().map(|r| (r, 200)),
        ("http-allow", "turnstile-inline") => cells::turnstile_inline_router().map(|r| (r, 200)),
        ("http-deny", "turnstile-inline") => {
            cells::turnstile_inline_deny_router().map(|r| (r, 429))
        }
        ("http-deny-bare", "turnstile-inline") => {
            cells::turnstile_inline_deny_bare_router().map(|r| (r, 429))
        }
        _ => return Err(format!("unknown cell {cell:?} / implementation {imp:?}")),
    };
    built.ok_or_else(|| format!("{cell} / {imp}: the router could not be built"))
}

fn run(cell: &str, imp: &str, ops: u64) -> Result<(), String> {
    let (router, expected) = router(cell, imp)?;
    let mut pipe = pipe::Pipe::new(router, PEER)?;
    let first = pipe.request()?;
    if first != 200 {
        return Err(format!("the first request got {first}, not 200"));
    }
    let last = measured(&mut pipe, ops)?;
    if ops > 0 && last != expected {
        return Err(format!(
            "{cell} / {imp}: the last request got {last}, not {expected}"
        ));
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parsed = match args.as_slice() {
        [cell, imp, ops] => ops.parse::<u64>().ok().map(|ops| (cell, imp, ops)),
        _ => None,
    };
    let Some((cell, imp, ops)) = parsed else {
        eprintln!(
            "usage: http_instructions <http-allow|http-deny|http-deny-bare> <none|pass-through|turnstile|turnstile-inline|governor> <ops>"
        );
        return ExitCode::from(2);
    };
    match run(cell, imp, ops) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("http_instructions: {e}");
            ExitCode::from(2)
        }
    }
}
