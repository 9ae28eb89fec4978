//! Hostile clients against `key::ForwardedIp` and `key::PeerIp` on a real axum server on
//! loopback (served with `ConnectInfo<SocketAddr>`), driven by a raw HTTP/1.1 client over a
//! `TcpStream`: the request bytes are written by hand, so a request can carry several lines of
//! one header, 8 KiB values, empty values and bytes that are not text. Connections from
//! 127.0.0.1 play the trusted proxy (the only address `ForwardedIp` trusts here); connections
//! from 127.0.0.2 an untrusted client that reached the server directly.
//!
//! Every scenario is `per_key` over a `KeyedTokenBucket` of burst 2 that never refills (its
//! clock is a `ManualClock` nobody advances), and asserts both the answers (how many of the
//! requests passed) and the keys the map holds afterwards, so a scenario passes only if the
//! key is the client the last trusted proxy saw, never one a request chose. The counts are
//! printed (`--nocapture`).
#![cfg(all(feature = "tower", feature = "axum"))]

use crate::common::summary;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::hash_map::RandomState;
use std::net::{IpAddr, SocketAddr};

use axum::routing::get;
use axum::Router;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;
use turnstile::tower::key::{Cidr, ForwardedIp, KeyExtractor, PeerIp, Prefix};
use turnstile::tower::{per_key, RateLimitLayer};
use turnstile::{KeyedTokenBucket, Limit, ManualClock, Nanos};

type Map = KeyedTokenBucket<IpAddr, RandomState, ManualClock>;

/// Counts the allocations of each thread, so that a test can say a call made none (or how
/// many: `multi` compares its reports with a single policy's).
struct Counting;

thread_local! {
    pub(crate) static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        unsafe {
            let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
            System.alloc(layout)
        }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        unsafe {
            let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
            System.realloc(ptr, layout, new_size)
        }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// The proxy's address: the one peer `trusting_the_proxy` trusts.
const PROXY: &str = "127.0.0.1";
/// A client connecting directly.
const DIRECT: &str = "127.0.0.2";
/// Every scenario's burst.
const BURST: usize = 2;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn trusted() -> [Cidr; 1] {
    ["127.0.0.1/32".parse().unwrap()]
}

/// One header line, `name: value`, the value as raw bytes.
fn h(name: &str, value: impl AsRef<[u8]>) -> Vec<u8> {
    let mut line = format!("{name}: ").into_bytes();
    line.extend_from_slice(value.as_ref());
    line
}

/// One request: its header lines, in order.
type Lines = Vec<Vec<u8>>;

/// Sends `GET /` with `lines` from `from` to `server` on a connection of its own, and returns
/// the response's status code.
async fn raw_get(server: SocketAddr, from: IpAddr, lines: &[Vec<u8>]) -> u16 {
    let sock = match from {
        IpAddr::V4(_) => TcpSocket::new_v4(),
        IpAddr::V6(_) => TcpSocket::new_v6(),
    }
    .unwrap();
    sock.bind(SocketAddr::new(from, 0)).unwrap();
    let mut s = sock.connect(server).await.unwrap();
    let mut req = b"GET / HTTP/1.1\r\nHost: turnstile\r\nConnection: close\r\n".to_vec();
    for l in lines {
        req.extend_from_slice(l);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"\r\n");
    s.write_all(&req).await.unwrap();
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).await.unwrap();
    let head = String::from_utf8_lossy(&resp[..resp.len().min(64)]).into_owned();
    head.strip_prefix("HTTP/1.1 ")
        .and_then(|r| r.get(..3))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP/1.1 response: {head:?}"))
}

/// What a scenario's requests got: how many passed, and the keys the map holds after them.
struct Outcome {
    sent: usize,
    allowed: usize,
    keys: usize,
    has: Box<dyn Fn(IpAddr) -> bool>,
}

impl Outcome {
    fn has(&self, key: &str) -> bool {
        (self.has)(ip(key))
    }

    /// Every request counted against `key` alone: `BURST` of them passed.
    fn one_key(&self, key: &str) {
        assert_eq!(
            (self.allowed, self.keys, self.has(key)),
            (BURST.min(self.sent), 1, true),
            "expected every request on the key {key}"
        );
    }
}

/// Serves `per_key` over `extractor` and a fresh map of burst 2 on 127.0.0.1 (or on `bind`),
/// sends every request of `requests` from `from`, and says what they got.
async fn scenario_on<X>(
    label: &str,
    bind: &str,
    extractor: X,
    from: &str,
    requests: Vec<Lines>,
) -> Outcome
where
    X: KeyExtractor<axum::body::Body, Key = IpAddr>,
{
    let map: Map = KeyedTokenBucket::builder(Limit::ZERO, BURST as u32)
        .clock(ManualClock::new(Nanos::new(1_000_000_000)))
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(per_key("per-client", extractor, map));
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer.clone());
    let listener = tokio::net::TcpListener::bind(bind).await.unwrap();
    let server = listener.local_addr().unwrap();
    let serving = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    let (sent, mut allowed) = (requests.len(), 0);
    for lines in &requests {
        match raw_get(server, ip(from), lines).await {
            200 => allowed += 1,
            429 => {}
            other => panic!("{label}: status {other}"),
        }
    }
    serving.abort();
    let keys = layer.policy().map().len();
    summary::line(&format!(
        "HOSTILE {label}: {sent} sent, {allowed} allowed, {keys} key(s)"
    ));
    Outcome {
        sent,
        allowed,
        keys,
        has: Box::new(move |k| layer.policy().map().contains(&k)),
    }
}

async fn scenario<X>(label: &str, extractor: X, from: &str, requests: Vec<Lines>) -> Outcome
where
    X: KeyExtractor<axum::body::Body, Key = IpAddr>,
{
    scenario_on(label, "127.0.0.1:0", extractor, from, requests).await
}

/// Twenty requests, the `n`th with the lines `f(n)`.
fn twenty(f: impl Fn(usize) -> Lines) -> Vec<Lines> {
    (1..=20).map(f).collect()
}

/// [`scenario`] of twenty requests from the proxy, the `n`th with the lines `f(n)`.
async fn through_proxy(label: &str, x: ForwardedIp, f: impl Fn(usize) -> Lines) -> Outcome {
    scenario(label, x, PROXY, twenty(f)).await
}

fn xff_proxy() -> ForwardedIp {
    ForwardedIp::x_forwarded_for(trusted())
}

fn forwarded_proxy() -> ForwardedIp {
    ForwardedIp::forwarded(trusted())
}

fn real_ip_proxy() -> ForwardedIp {
    ForwardedIp::header(http::HeaderName::from_static("x-real-ip"), trusted())
}

// ---- which header -----------------------------------------------------------------------

/// The first row: the proxy appends to `X-Forwarded-For`, the client sends its own
/// `Forwarded: for=<new address>` on every request. The header read is the one the operator
/// named, so the forged one is never read: 2 of 20 pass.
#[tokio::test]
async fn a_forged_forwarded_beside_the_proxys_xff_picks_no_key() {
    let out = through_proxy(
        "forged Forwarded beside the proxy's XFF",
        xff_proxy(),
        |n| {
            vec![
                h("Forwarded", format!("for=203.0.113.{n}")),
                h("X-Forwarded-For", "198.51.100.7"),
            ]
        },
    )
    .await;
    out.one_key("198.51.100.7");
}

/// The reverse: the proxy writes `Forwarded`, the client sends `X-Forwarded-For`.
#[tokio::test]
async fn a_forged_xff_beside_the_proxys_forwarded_picks_no_key() {
    let out = through_proxy(
        "forged XFF beside the proxy's Forwarded",
        forwarded_proxy(),
        |n| {
            vec![
                h("X-Forwarded-For", format!("203.0.113.{n}")),
                h("Forwarded", "for=198.51.100.7;proto=https"),
            ]
        },
    )
    .await;
    out.one_key("198.51.100.7");
}

/// A single-address header (`X-Real-IP`, `CF-Connecting-IP`) the proxy sets: the other
/// headers the client sends are not read, and of several values the last (the proxy's) is.
#[tokio::test]
async fn a_single_address_header_is_the_only_one_read() {
    let out = through_proxy(
        "X-Real-IP beside forged XFF and Forwarded",
        real_ip_proxy(),
        |n| {
            vec![
                h("X-Forwarded-For", format!("203.0.113.{n}")),
                h("Forwarded", format!("for=203.0.114.{n}")),
                h("X-Real-IP", "198.51.100.7:5000"),
            ]
        },
    )
    .await;
    out.one_key("198.51.100.7");
    // The client's own line first, the proxy's after it: the proxy's.
    let out = through_proxy(
        "X-Real-IP, the client's line before the proxy's",
        real_ip_proxy(),
        |n| {
            vec![
                h("X-Real-IP", format!("203.0.113.{n}")),
                h("X-Real-IP", "198.51.100.7"),
            ]
        },
    )
    .await;
    out.one_key("198.51.100.7");
    // One client per address, one key each.
    let out = through_proxy("X-Real-IP of 20 clients", real_ip_proxy(), |n| {
        vec![h("X-Real-IP", format!("[2001:db8:{n}::1]:443"))]
    })
    .await;
    assert_eq!((out.allowed, out.keys), (20, 20));
    assert!(out.has("2001:db8:7::"));
}

/// A client that reaches the server itself, not through the proxy, sends every header with
/// a new address each time: none is read, whatever the extractor reads; its key is its own
/// address.
#[tokio::test]
async fn an_untrusted_peer_sending_every_header_is_its_own_key() {
    let every = |n| {
        vec![
            h("X-Forwarded-For", format!("203.0.113.{n}")),
            h("Forwarded", format!("for=203.0.114.{n}")),
            h("X-Real-IP", format!("203.0.115.{n}")),
        ]
    };
    for (label, x) in [
        ("direct client, XFF extractor", xff_proxy()),
        ("direct client, Forwarded extractor", forwarded_proxy()),
        ("direct client, X-Real-IP extractor", real_ip_proxy()),
    ] {
        scenario(label, x, DIRECT, twenty(every))
            .await
            .one_key(DIRECT);
    }
}

/// Several lines of the header are one chain, in order: a client's own lines come first,
/// the proxy's last, and the walk from the right meets the proxy's first.
#[tokio::test]
async fn several_header_lines_are_one_chain() {
    let out = through_proxy("client's XFF lines, then the proxy's", xff_proxy(), |n| {
        vec![
            h("X-Forwarded-For", format!("203.0.113.{n}")),
            h("X-Forwarded-For", format!("203.0.114.{n}, 127.0.0.1")),
            h("X-Forwarded-For", "198.51.100.7"),
        ]
    })
    .await;
    out.one_key("198.51.100.7");
    let out = through_proxy(
        "client's Forwarded lines, then the proxy's",
        forwarded_proxy(),
        |n| {
            vec![
                h("Forwarded", format!("for=203.0.113.{n}")),
                h("Forwarded", "for=198.51.100.7"),
            ]
        },
    )
    .await;
    out.one_key("198.51.100.7");
}

// ---- ports, brackets, mapped addresses --------------------------------------------------

/// The second row: proxies that append `ip:port` — 20 clients, 20 keys, every
/// request passes.
#[tokio::test]
async fn xff_hops_with_ports_are_one_key_per_client() {
    let out = through_proxy("XFF 192.0.2.N:5000 for 20 clients", xff_proxy(), |n| {
        vec![h("X-Forwarded-For", format!("192.0.2.{n}:5000"))]
    })
    .await;
    assert_eq!((out.allowed, out.keys), (20, 20));
    assert!(out.has("192.0.2.20"));
    assert!(!out.has("0.0.0.0"));
}

/// Brackets, ports and quotes in every header: each form of one client's address is that
/// client.
#[tokio::test]
async fn brackets_ports_and_quotes_parse_in_every_header() {
    let v6 = "2001:db8:1:2::";
    for (label, x, forms) in [
        (
            "XFF forms",
            xff_proxy(),
            vec![
                "[2001:db8:1:2::7]:4711",
                "[2001:db8:1:2::7]",
                "2001:db8:1:2::7",
                " 2001:db8:1:2::7 ",
            ],
        ),
        (
            "Forwarded forms",
            forwarded_proxy(),
            vec![
                "for=\"[2001:db8:1:2::7]:4711\"",
                "for=\"[2001:db8:1:2::7]\"",
                "For=\"[2001:db8:1:2::7]:_port\";proto=https",
                "by=127.0.0.1;for=\"[2001:db8:1:2::7]\"",
            ],
        ),
        (
            "X-Real-IP forms",
            real_ip_proxy(),
            vec![
                "[2001:db8:1:2::7]:4711",
                "[2001:db8:1:2::7]",
                "2001:db8:1:2::7",
            ],
        ),
    ] {
        let name = match label {
            "XFF forms" => "X-Forwarded-For",
            "Forwarded forms" => "Forwarded",
            _ => "X-Real-IP",
        };
        let requests = forms.iter().map(|f| vec![h(name, f)]).collect();
        let out = scenario(label, x, PROXY, requests).await;
        out.one_key(v6);
    }
    // IPv4 with a port, quoted in Forwarded.
    let out = scenario(
        "Forwarded \"192.0.2.7:5000\"",
        forwarded_proxy(),
        PROXY,
        vec![
            vec![h("Forwarded", "for=\"192.0.2.7:5000\"")],
            vec![h("Forwarded", "for=192.0.2.7")],
            vec![h("Forwarded", "for=\"192.0.2.7\"")],
        ],
    )
    .await;
    out.one_key("192.0.2.7");
}

/// An IPv4 client written as an IPv4-mapped IPv6 address (what a dual-stack proxy reports)
/// is the IPv4 client; and a proxy reached over a dual-stack socket (the peer
/// `::ffff:127.0.0.1`) is the trusted `127.0.0.1`.
#[tokio::test]
async fn an_ipv4_mapped_client_is_the_ipv4_client() {
    let out = scenario(
        "XFF ::ffff:192.0.2.9 in three forms",
        xff_proxy(),
        PROXY,
        vec![
            vec![h("X-Forwarded-For", "::ffff:192.0.2.9")],
            vec![h("X-Forwarded-For", "[::ffff:192.0.2.9]:80")],
            vec![h("X-Forwarded-For", "192.0.2.9")],
        ],
    )
    .await;
    out.one_key("192.0.2.9");
    let out = scenario_on(
        "dual-stack server, proxy as ::ffff:127.0.0.1",
        "[::ffff:127.0.0.1]:0",
        xff_proxy(),
        "::ffff:127.0.0.1",
        twenty(|n| vec![h("X-Forwarded-For", format!("192.0.2.{n}"))]),
    )
    .await;
    assert_eq!((out.allowed, out.keys), (20, 20));
    assert!(out.has("192.0.2.20"));
}

// ---- prefixes ---------------------------------------------------------------------------

/// The third row: 20 addresses of one IPv6 /64 are one client (its subscriber
/// assignment) by default.
#[tokio::test]
async fn twenty_addresses_of_one_slash_64_are_one_key() {
    let out = through_proxy("20 addresses of 2001:db8:1:2::/64", xff_proxy(), |n| {
        vec![h("X-Forwarded-For", format!("2001:db8:1:2:{n:x}::{n:x}"))]
    })
    .await;
    out.one_key("2001:db8:1:2::");
}

/// /128 and /56 are choices: one key per address, or one per /56.
#[tokio::test]
async fn other_prefixes_are_a_choice() {
    let per_address = xff_proxy().prefix(Prefix::FULL);
    let out = through_proxy("20 addresses of one /64 at /128", per_address, |n| {
        vec![h("X-Forwarded-For", format!("2001:db8:1:2::{n:x}"))]
    })
    .await;
    assert_eq!((out.allowed, out.keys), (20, 20));
    assert!(out.has("2001:db8:1:2::14"));
    let per_56 = xff_proxy().prefix(Prefix::new(24, 56).unwrap());
    let out = through_proxy(
        "20 /64s of one /56, and one IPv4 /24, at /56 and /24",
        per_56,
        |n| {
            let addr = if n % 2 == 0 {
                format!("2001:db8:1:{n:x}::1")
            } else {
                format!("192.0.2.{n}")
            };
            vec![h("X-Forwarded-For", addr)]
        },
    )
    .await;
    assert_eq!((out.allowed, out.keys), (4, 2));
    assert!(out.has("2001:db8:1::") && out.has("192.0.2.0"));
}

/// `PeerIp` keys by the same default prefixes, and by others on request: a real IPv6 peer
/// (`::1`) is its /64, `::`, by default and itself at /128.
#[tokio::test]
async fn the_peer_is_keyed_by_its_prefix() {
    let out = scenario_on(
        "PeerIp, ::1 at the default /64",
        "[::1]:0",
        PeerIp,
        "::1",
        twenty(|_| vec![]),
    )
    .await;
    out.one_key("::");
    let out = scenario_on(
        "PeerIp, ::1 at /128",
        "[::1]:0",
        PeerIp.prefix(Prefix::FULL),
        "::1",
        twenty(|_| vec![]),
    )
    .await;
    out.one_key("::1");
}

// ---- what cannot be read ----------------------------------------------------------------

/// `unknown`, obfuscated nodes, garbage and a `Forwarded` element without `for=`, where the
/// walk meets them (to the right of any client address): the chain cannot be followed past
/// them, so the key is the trusted hop that wrote them (here the peer, the proxy), whatever
/// the client wrote further left.
#[tokio::test]
async fn an_unreadable_hop_is_the_trusted_hop_that_wrote_it() {
    for (label, x, name, tail) in [
        (
            "Forwarded for=unknown",
            forwarded_proxy(),
            "Forwarded",
            "for=unknown",
        ),
        (
            "Forwarded obfuscated",
            forwarded_proxy(),
            "Forwarded",
            "for=_hidden",
        ),
        (
            "Forwarded element without for=",
            forwarded_proxy(),
            "Forwarded",
            "proto=https;by=127.0.0.1",
        ),
        (
            "Forwarded garbage",
            forwarded_proxy(),
            "Forwarded",
            "for=\"[2001:db8::1\"",
        ),
        ("XFF unknown", xff_proxy(), "X-Forwarded-For", "unknown"),
        (
            "XFF garbage",
            xff_proxy(),
            "X-Forwarded-For",
            "198.51.100.7x",
        ),
        (
            "XFF bad port",
            xff_proxy(),
            "X-Forwarded-For",
            "198.51.100.7:99999",
        ),
        (
            "XFF zone id",
            xff_proxy(),
            "X-Forwarded-For",
            "fe80::1%eth0",
        ),
    ] {
        let prefix = if name == "Forwarded" { "for=" } else { "" };
        let out = through_proxy(label, x, |n| {
            vec![h(name, format!("{prefix}203.0.113.{n}, {tail}"))]
        })
        .await;
        out.one_key(PROXY);
    }
    // Behind a second trusted proxy: the key is the trusted hop to the right of the
    // unreadable one, the proxy that wrote it.
    let two = ForwardedIp::x_forwarded_for([
        "127.0.0.1/32".parse().unwrap(),
        "10.0.0.0/8".parse().unwrap(),
    ]);
    let out = through_proxy(
        "XFF garbage written by the inner proxy 10.1.2.3",
        two,
        |n| {
            vec![h(
                "X-Forwarded-For",
                format!("203.0.113.{n}, junk, 10.1.2.3"),
            )]
        },
    )
    .await;
    out.one_key("10.1.2.3");
}

/// Empty values and empty elements read like any unreadable hop: an empty header from the
/// proxy is the proxy; an empty element the walk meets stops it; empty elements a client
/// wrote to the left of its own address change nothing.
#[tokio::test]
async fn empty_values_and_elements() {
    for (label, value) in [
        ("empty XFF", String::new()),
        ("blank XFF", "  ".to_string()),
        (
            "XFF ending in an empty element",
            "203.0.113.N, ".to_string(),
        ),
        ("XFF of commas", ",,,".to_string()),
    ] {
        let out = through_proxy(label, xff_proxy(), |n| {
            vec![h("X-Forwarded-For", value.replace('N', &n.to_string()))]
        })
        .await;
        out.one_key(PROXY);
    }
    let out = through_proxy("empty elements left of the client", xff_proxy(), |n| {
        vec![h(
            "X-Forwarded-For",
            format!(",203.0.113.{n},, ,198.51.100.7"),
        )]
    })
    .await;
    out.one_key("198.51.100.7");
    let out = through_proxy("empty Forwarded", forwarded_proxy(), |n| {
        vec![
            h("Forwarded", format!("for=203.0.113.{n}")),
            h("Forwarded", ""),
        ]
    })
    .await;
    out.one_key(PROXY);
}

/// Bytes that are not text, where a client wrote them (to the left of its own address, in
/// the line a proxy appended to), change nothing; where the walk meets them they read like
/// any unreadable hop.
#[tokio::test]
async fn bytes_that_are_not_text() {
    let out = through_proxy("XFF with obs-text left of the client", xff_proxy(), |n| {
        let mut v = format!("203.0.113.{n}").into_bytes();
        v.extend_from_slice(b"\xff\xfe\x80, 198.51.100.7");
        vec![h("X-Forwarded-For", v)]
    })
    .await;
    out.one_key("198.51.100.7");
    let out = through_proxy("XFF ending in obs-text", xff_proxy(), |n| {
        let mut v = format!("203.0.113.{n}, 198.51.100.7").into_bytes();
        v.extend_from_slice(b"\xff");
        vec![h("X-Forwarded-For", v)]
    })
    .await;
    out.one_key(PROXY);
}

/// An 8 KiB header: a client's 8 KiB of addresses (a new set each request) left of its own
/// address is walked past at once; 8 KiB of trusted hops is walked no further than
/// `ForwardedIp::MAX_HOPS` of them, and reads as a chain the walk cannot finish.
#[tokio::test]
async fn eight_kib_headers() {
    let out = through_proxy(
        "8 KiB of forged hops left of the client",
        xff_proxy(),
        |n| {
            let mut v = String::new();
            let mut i = 0;
            while v.len() < 8 * 1024 {
                v.push_str(&format!("203.0.{n}.{}, ", i % 250));
                i += 1;
            }
            v.push_str("198.51.100.7");
            vec![h("X-Forwarded-For", v)]
        },
    )
    .await;
    out.one_key("198.51.100.7");
    let out = through_proxy(
        "8 KiB of trusted hops right of a forged one",
        xff_proxy(),
        |n| {
            let mut v = format!("203.0.113.{n}");
            while v.len() < 8 * 1024 {
                v.push_str(", 127.0.0.1");
            }
            vec![h("X-Forwarded-For", v)]
        },
    )
    .await;
    out.one_key(PROXY);
}

/// Reading the key of a request with 8 KiB headers allocates nothing, however the walk ends:
/// at the client past 8 KiB of forged hops, at the hop cap in 8 KiB of trusted ones, at an
/// unreadable hop, or in a single-address header.
#[test]
fn the_walk_allocates_nothing() {
    let forged: String = (0..700)
        .map(|i| format!("203.0.{}.{}, ", i / 250, i % 250))
        .collect();
    let trusted_hops = ", 127.0.0.1".repeat(800);
    let real_ip = http::HeaderName::from_static("x-real-ip");
    let cases: [(ForwardedIp, &str, String, &str); 5] = [
        (
            xff_proxy(),
            "x-forwarded-for",
            format!("{forged}198.51.100.7:5000"),
            "198.51.100.7",
        ),
        (
            xff_proxy(),
            "x-forwarded-for",
            format!("203.0.113.1{trusted_hops}"),
            PROXY,
        ),
        (
            xff_proxy(),
            "x-forwarded-for",
            format!("{forged}198.51.100.7, unknown"),
            PROXY,
        ),
        (
            forwarded_proxy(),
            "forwarded",
            format!("for={forged}for=\"[2001:db8:1:2::7]:4711\";proto=https"),
            "2001:db8:1:2::",
        ),
        (
            ForwardedIp::header(real_ip, trusted()),
            "x-real-ip",
            format!("{forged}198.51.100.7"),
            "198.51.100.7",
        ),
    ];
    for (x, name, value, want) in cases {
        assert!(value.len() >= 8 * 1024, "{}", value.len());
        let mut req = http::Request::get("/")
            .header(name, value)
            .body(())
            .unwrap();
        req.extensions_mut()
            .insert(SocketAddr::new(ip(PROXY), 5000));
        let before = ALLOCATIONS.with(Cell::get);
        let key = x.extract(&req);
        let allocations = ALLOCATIONS.with(Cell::get) - before;
        assert_eq!((key, allocations), (Some(ip(want)), 0), "{name}");
    }
}

// ---- keys from a header -----------------------------------------------------------------

/// `key::Header` takes at most 256 bytes of visible ASCII: a longer value, one that is not
/// text and an empty one are no key, so the policy's missing-key choice answers them. Under
/// `MissingKey::Deny` they are refused; under `Allow` (per_key's default) they pass, every
/// one: the reason the docs tell header-keyed limits to refuse keyless requests.
#[tokio::test]
async fn header_keys_over_the_cap_or_not_text_are_no_key() {
    use turnstile::tower::key::Header;
    use turnstile::tower::MissingKey;

    let long = "k".repeat(256); // the default cap
    let values: Vec<Vec<u8>> = vec![
        long.clone().into_bytes(),
        format!("{long}k").into_bytes(),
        b"key-\xff".to_vec(),
        Vec::new(),
    ];
    for (missing, want) in [
        (MissingKey::Deny, [200, 429, 429, 429]),
        (MissingKey::Allow, [200, 200, 200, 200]),
    ] {
        let map: KeyedTokenBucket<String, RandomState, ManualClock> =
            KeyedTokenBucket::builder(Limit::ZERO, BURST as u32)
                .clock(ManualClock::new(Nanos::new(1_000_000_000)))
                .build()
                .unwrap();
        let api_key = Header(http::HeaderName::from_static("x-api-key"));
        let policy = per_key("per-api-key", api_key, map).on_missing_key(missing.clone());
        let layer = RateLimitLayer::new(policy);
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = listener.local_addr().unwrap();
        let serving = tokio::spawn(async move {
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await
            .unwrap();
        });
        let mut got = [0; 4];
        for (i, v) in values.iter().enumerate() {
            // Twice each: the same answer both times (the 256-byte key's burst is two).
            got[i] = raw_get(server, ip(DIRECT), &[h("X-Api-Key", v)]).await;
            let again = raw_get(server, ip(DIRECT), &[h("X-Api-Key", v)]).await;
            assert_eq!(
                again, got[i],
                "{missing:?}, value {i}: the same answer twice"
            );
        }
        serving.abort();
        let keys = layer.policy().map().len();
        summary::line(&format!(
            "HOSTILE x-api-key of 256 B, 257 B, obs-text, empty under {missing:?}: {got:?}, {keys} key(s)"
        ));
        // Only the 256-byte value is a key.
        assert_eq!((got, keys), (want, 1), "{missing:?}");
        assert!(layer.policy().map().contains(&long));
    }
}
