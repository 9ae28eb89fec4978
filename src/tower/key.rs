//! Key extractors: which client a request counts against.
//!
//! | extractor | key | from |
//! |---|---|---|
//! | [`PeerIp`] | `IpAddr` | the connection's peer address (axum's `ConnectInfo<SocketAddr>`, or a `SocketAddr` extension) |
//! | [`ForwardedIp`] | `IpAddr` | `Forwarded` / `X-Forwarded-For`, **only** when the peer is a trusted proxy; else the peer |
//! | [`Header`] | `String` | a request header's value |
//! | [`from_fn`] | anything | a function of the request |
//!
//! A forged `X-Forwarded-For` must not pick the key: anyone can send the header, so
//! [`ForwardedIp`] reads it only from a peer in its trusted proxy list, and then walks the
//! chain from the right (the hops nearest to this server), skipping trusted proxies, to the
//! first address that is not one: the client as the last trusted proxy saw it. Addresses a
//! client wrote further left are never used, whatever they say.

use std::hash::Hash;
use std::marker::PhantomData;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use http::{HeaderName, Request};

/// The key type of an extractor, whatever the request body: so that
/// [`per_key`](super::per_key) can infer its map's key type from the extractor alone.
pub trait KeyType {
    /// The key.
    type Key: Hash + Eq + Clone + Send + Sync + 'static;
}

/// Reads a rate-limit key from a request; `None` when the request has none (see
/// [`MissingKey`](super::MissingKey)).
pub trait KeyExtractor<B>: KeyType + Send + Sync + 'static {
    /// The key of `req`, if it has one.
    fn extract(&self, req: &Request<B>) -> Option<Self::Key>;
}

/// The peer's IP address: from axum's `ConnectInfo<SocketAddr>` (feature `axum`; serve with
/// `into_make_service_with_connect_info::<SocketAddr>()`), from a plain [`SocketAddr`]
/// request extension (what a hand-written hyper server can insert), or from tonic's
/// `TcpConnectInfo` (feature `tonic`: what a tonic server serving plain TCP puts on every
/// request; over TLS tonic puts a `TlsConnectInfo` instead, which a [`from_fn`] can read).
#[derive(Debug, Clone, Copy, Default)]
pub struct PeerIp;

/// The peer address of `req`, from the extensions [`PeerIp`] reads.
#[inline]
pub fn peer_addr<B>(req: &Request<B>) -> Option<SocketAddr> {
    #[cfg(feature = "axum")]
    if let Some(info) = req
        .extensions()
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(info.0);
    }
    if let Some(addr) = req.extensions().get::<SocketAddr>() {
        return Some(*addr);
    }
    // Last: a lookup that only tonic's requests pay for, not axum's or hyper's.
    #[cfg(feature = "tonic")]
    if let Some(info) = req
        .extensions()
        .get::<tonic::transport::server::TcpConnectInfo>()
    {
        return info.remote_addr();
    }
    None
}

impl KeyType for PeerIp {
    type Key = IpAddr;
}

impl<B> KeyExtractor<B> for PeerIp {
    #[inline]
    fn extract(&self, req: &Request<B>) -> Option<IpAddr> {
        peer_addr(req).map(|a| canonical(a.ip()))
    }
}

/// The client's address as trusted proxies report it (see the [module docs](self)): the
/// rightmost address of `Forwarded` (its `for=` parameters; RFC 7239) or, without it,
/// `X-Forwarded-For`, that is not itself a trusted proxy — read only when the peer is a
/// trusted proxy. From any other peer the headers are ignored and the key is the peer's
/// address, so a client cannot pick its own key.
///
/// ```
/// use turnstile::tower::key::{Cidr, ForwardedIp};
///
/// let key = ForwardedIp::new(["10.0.0.0/8".parse::<Cidr>().unwrap(), "127.0.0.1/32".parse().unwrap()]);
/// # let _ = key;
/// ```
#[derive(Debug, Clone)]
pub struct ForwardedIp {
    trusted: Vec<Cidr>,
}

impl ForwardedIp {
    /// Trusts the proxies in `trusted` (networks, e.g. `10.0.0.0/8`, or single addresses as
    /// `/32` or `/128`).
    pub fn new(trusted: impl IntoIterator<Item = Cidr>) -> Self {
        ForwardedIp {
            trusted: trusted.into_iter().collect(),
        }
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|c| c.contains(ip))
    }

    /// The client address for a request from `peer` with these headers.
    fn client<B>(&self, req: &Request<B>, peer: IpAddr) -> IpAddr {
        if !self.is_trusted(peer) {
            return peer;
        }
        let headers = req.headers();
        let forwarded = headers.get_all(http::header::FORWARDED);
        let is_forwarded = forwarded.iter().next().is_some();
        let lines = if is_forwarded {
            forwarded
        } else {
            headers.get_all("x-forwarded-for")
        };
        // A line that is not text: the chain cannot be read at all.
        if lines.iter().any(|v| v.to_str().is_err()) {
            return peer;
        }
        // The chain is every hop of every line, left to right; walked here from the right
        // (lines, elements and parameters each in reverse), with no list of it built: every
        // trusted hop vouches for the one to its left, so the first untrusted one is the
        // client. An obfuscated, unknown or unparsable node reads as 0.0.0.0: the chain
        // cannot be followed past it.
        let unknown = IpAddr::from([0u8, 0, 0, 0]);
        let mut leftmost = None;
        for v in lines.iter().rev() {
            let v = v.to_str().unwrap_or_default();
            for element in v.rsplit(',') {
                if is_forwarded {
                    for pair in element.rsplit(';') {
                        let Some((k, val)) = pair.trim().split_once('=') else {
                            continue;
                        };
                        if k.trim().eq_ignore_ascii_case("for") {
                            let ip = parse_forwarded_node(val.trim()).unwrap_or(unknown);
                            if !self.is_trusted(ip) {
                                return ip;
                            }
                            leftmost = Some(ip);
                        }
                    }
                } else {
                    let ip = IpAddr::from_str(element.trim()).map_or(unknown, canonical);
                    if !self.is_trusted(ip) {
                        return ip;
                    }
                    leftmost = Some(ip);
                }
            }
        }
        // Every hop trusted (or no header): the leftmost, or the peer.
        leftmost.unwrap_or(peer)
    }
}

impl KeyType for ForwardedIp {
    type Key = IpAddr;
}

impl<B> KeyExtractor<B> for ForwardedIp {
    fn extract(&self, req: &Request<B>) -> Option<IpAddr> {
        let peer = canonical(peer_addr(req)?.ip());
        Some(self.client(req, peer))
    }
}

/// A `Forwarded` node: `192.0.2.60`, `"192.0.2.60:4711"`, `"[2001:db8::1]:4711"`.
fn parse_forwarded_node(v: &str) -> Option<IpAddr> {
    let v = v.trim_matches('"');
    if let Some(rest) = v.strip_prefix('[') {
        let end = rest.find(']')?;
        return rest[..end].parse().ok().map(canonical);
    }
    let host = match v.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !h.contains(':') => h,
        _ => v,
    };
    host.parse().ok().map(canonical)
}

/// An IPv4 address mapped into IPv6 (`::ffff:a.b.c.d`, what a dual-stack socket reports) is
/// the IPv4 client it stands for: one client, one key.
#[inline]
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// A network, `10.0.0.0/8` or `2001:db8::/32`; a bare address is its own network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

/// Why a [`Cidr`] did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a network (`10.0.0.0/8`, `::1/128` or an address): {0:?}")]
pub struct CidrError(String);

impl Cidr {
    /// Whether `ip` is in the network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, canonical(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Cidr, CidrError> {
        let bad = || CidrError(s.to_string());
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr = canonical(IpAddr::from_str(addr.trim()).map_err(|_| bad())?);
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p.trim().parse::<u8>().map_err(|_| bad())?,
            None => max,
        };
        if prefix > max {
            return Err(bad());
        }
        Ok(Cidr { addr, prefix })
    }
}

/// The value of a request header (e.g. an API key), as a `String`; a request without it, or
/// with a value that is not visible ASCII, has no key.
#[derive(Debug, Clone)]
pub struct Header(pub HeaderName);

impl KeyType for Header {
    type Key = String;
}

impl<B> KeyExtractor<B> for Header {
    fn extract(&self, req: &Request<B>) -> Option<String> {
        let v = req.headers().get(&self.0)?.to_str().ok()?;
        Some(v.to_string())
    }
}

/// A key extractor from a function of the request: [`from_fn`].
pub struct FromFn<F, K>(F, PhantomData<fn() -> K>);

impl<F: Clone, K> Clone for FromFn<F, K> {
    fn clone(&self) -> Self {
        FromFn(self.0.clone(), PhantomData)
    }
}

/// Any function of the request as a key extractor.
///
/// ```
/// use turnstile::tower::key::{from_fn, KeyExtractor};
///
/// // The first path segment: one limit per API route family.
/// let route = from_fn(|req: &http::Request<()>| {
///     req.uri().path().split('/').nth(1).map(str::to_owned)
/// });
/// let req = http::Request::get("/users/42").body(()).unwrap();
/// assert_eq!(route.extract(&req).as_deref(), Some("users"));
/// ```
pub fn from_fn<B, K, F>(f: F) -> FromFn<F, K>
where
    F: Fn(&Request<B>) -> Option<K>,
{
    FromFn(f, PhantomData)
}

impl<F, K: Hash + Eq + Clone + Send + Sync + 'static> KeyType for FromFn<F, K> {
    type Key = K;
}

impl<B, K, F> KeyExtractor<B> for FromFn<F, K>
where
    F: Fn(&Request<B>) -> Option<K> + Send + Sync + 'static,
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    fn extract(&self, req: &Request<B>) -> Option<K> {
        (self.0)(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(peer: &str, headers: &[(&str, &str)]) -> Request<()> {
        let mut b = Request::get("/");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let mut r = b.body(()).unwrap();
        r.extensions_mut()
            .insert(peer.parse::<SocketAddr>().unwrap());
        r
    }

    fn proxies() -> ForwardedIp {
        ForwardedIp::new(["10.0.0.0/8".parse().unwrap(), "::1".parse().unwrap()])
    }

    #[test]
    fn a_forged_header_from_an_untrusted_peer_is_ignored() {
        let r = req("203.0.113.9:5000", &[("x-forwarded-for", "1.2.3.4")]);
        assert_eq!(proxies().extract(&r), Some("203.0.113.9".parse().unwrap()));
        let r = req("203.0.113.9:5000", &[("forwarded", "for=1.2.3.4")]);
        assert_eq!(proxies().extract(&r), Some("203.0.113.9".parse().unwrap()));
    }

    #[test]
    fn through_trusted_proxies_the_rightmost_untrusted_hop_is_the_client() {
        // The client wrote "6.6.6.6" itself; the edge proxy appended the real client.
        let r = req(
            "10.0.0.2:5000",
            &[("x-forwarded-for", "6.6.6.6, 198.51.100.7, 10.0.0.1")],
        );
        assert_eq!(proxies().extract(&r), Some("198.51.100.7".parse().unwrap()));
        let r = req(
            "10.0.0.2:5000",
            &[(
                "forwarded",
                "for=6.6.6.6, for=\"[2001:db8::7]:4711\";proto=https, for=10.0.0.1",
            )],
        );
        assert_eq!(proxies().extract(&r), Some("2001:db8::7".parse().unwrap()));
        // Garbage to the right of the client cannot be skipped: it stops the walk.
        let r = req(
            "10.0.0.2:5000",
            &[("x-forwarded-for", "198.51.100.7, junk")],
        );
        assert_eq!(proxies().extract(&r), Some("0.0.0.0".parse().unwrap()));
        // A trusted peer with no header is the client itself.
        let r = req("[::1]:5000", &[]);
        assert_eq!(proxies().extract(&r), Some("::1".parse().unwrap()));
    }

    #[test]
    fn the_chain_runs_across_header_lines_and_ends_at_its_leftmost_hop() {
        let peer = "10.0.0.2:5000";
        let xff = |lines: &[&str]| {
            let r = req(
                peer,
                &lines
                    .iter()
                    .map(|l| ("x-forwarded-for", *l))
                    .collect::<Vec<_>>(),
            );
            proxies().extract(&r).unwrap().to_string()
        };
        // Lines in order, each read left to right: one chain.
        assert_eq!(xff(&["6.6.6.6, 198.51.100.7", "10.0.0.1"]), "198.51.100.7");
        assert_eq!(xff(&["198.51.100.7", "10.0.0.1, 10.0.0.3"]), "198.51.100.7");
        // Every hop trusted: the leftmost.
        assert_eq!(xff(&["10.0.0.5, 10.0.0.1", "10.0.0.3"]), "10.0.0.5");
        // Several `for=` in one element are read left to right too.
        let r = req(
            peer,
            &[
                ("forwarded", "for=198.51.100.8;for=10.0.0.3"),
                ("forwarded", "for=10.0.0.1"),
            ],
        );
        assert_eq!(proxies().extract(&r), Some("198.51.100.8".parse().unwrap()));
        // A line that is not text: the chain cannot be read, the peer is the key.
        let mut r = req(peer, &[("x-forwarded-for", "198.51.100.7")]);
        r.headers_mut().append(
            "x-forwarded-for",
            http::HeaderValue::from_bytes(b"\xff").unwrap(),
        );
        assert_eq!(proxies().extract(&r), Some("10.0.0.2".parse().unwrap()));
    }

    #[test]
    fn mapped_ipv4_is_the_ipv4_client() {
        let r = req("[::ffff:203.0.113.9]:5000", &[]);
        assert_eq!(PeerIp.extract(&r), Some("203.0.113.9".parse().unwrap()));
    }

    #[test]
    fn cidrs() {
        let c: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(c.contains("10.255.0.1".parse().unwrap()));
        assert!(!c.contains("11.0.0.1".parse().unwrap()));
        assert!(c.contains("::ffff:10.1.2.3".parse().unwrap()));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("1.2.3.4".parse().unwrap()));
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("nope".parse::<Cidr>().is_err());
        let one: Cidr = "2001:db8::1".parse().unwrap();
        assert!(one.contains("2001:db8::1".parse().unwrap()));
        assert!(!one.contains("2001:db8::2".parse().unwrap()));
    }
}
