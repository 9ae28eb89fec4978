//! Key extractors: which client a request counts against.
//!
//! | extractor | key | from |
//! |---|---|---|
//! | [`PeerIp`](struct@PeerIp) | `IpAddr`, a network ([`Prefix`]) | the connection's peer address (axum's `ConnectInfo<SocketAddr>`, or a `SocketAddr` extension) |
//! | [`ForwardedIp`] | `IpAddr`, a network ([`Prefix`]) | the one header the operator names (`X-Forwarded-For`, `Forwarded` or a single-address header), **only** when the peer is a trusted proxy; else the peer |
//! | [`Header`](struct@Header) | `String` | a request header's value, at most 256 bytes of visible ASCII |
//! | [`from_fn`] | anything | a function of the request |
//!
//! # Key extraction rules
//!
//! - **One header, named at construction.** [`ForwardedIp::x_forwarded_for`] (what nginx,
//!   ALB, Envoy and Cloudflare append to), [`ForwardedIp::forwarded`] (RFC 7239) or
//!   [`ForwardedIp::header`] (one address a trusted peer sets: `X-Real-IP`,
//!   `CF-Connecting-IP`). Nothing a request carries switches it: a client that sends
//!   `Forwarded` to a server that reads the `X-Forwarded-For` its proxy writes is not heard.
//!   Name the header your proxy writes: a header it passes through untouched is the client's.
//! - **Trust.** The header is read only when the peer is in the trusted list; any other
//!   peer's key is its own address, whatever it sends. Trust the proxies' own addresses
//!   only: a host inside a trusted network can write any chain it likes.
//! - **From the right.** Each trusted proxy appends the address it received the request
//!   from, so the chain is walked from its right end (the hop nearest this server; lines
//!   of the header in order, read as one list), skipping trusted proxies, to the first
//!   address that is not one: the client as the last trusted proxy saw it. What a client
//!   wrote further left is never read, whatever it is (8 KiB of addresses, bytes that are
//!   not text).
//! - **Ports, brackets, quotes.** A hop is `192.0.2.7`, `192.0.2.7:5000`, `2001:db8::7`,
//!   `[2001:db8::7]`, `[2001:db8::7]:4711`, optionally in double quotes (as `Forwarded`
//!   writes them), the port digits or an obfuscated `_name`. An IPv4-mapped IPv6 address
//!   (`::ffff:192.0.2.7`) is the IPv4 client. Trusted proxies are matched on the whole
//!   address.
//! - **A hop that cannot be read stops the walk.** `unknown`, an obfuscated `_name`,
//!   garbage, an empty element, a `Forwarded` element without exactly one `for=`, bytes
//!   that are not text; and a chain whose first [`ForwardedIp::MAX_HOPS`] hops from the
//!   right are all trusted. Where the walk meets such a hop, every hop to its right was
//!   written by a trusted proxy, and the nearest of them (the peer, when the hop is the
//!   rightmost) wrote the one it cannot name. The key is that proxy: the last trusted hop
//!   the walk passed. So a client can neither choose a key (the proxies are the
//!   operator's) nor spread itself over many: whatever it sends, it is keyed by its own
//!   address or by a trusted proxy's. An empty or absent header from a trusted peer reads
//!   the same way: the peer is the key.
//! - **Networks, not addresses.** The key is the client's address masked to a [`Prefix`]:
//!   /32 for IPv4 and /64 for IPv6 by default, because a /64 is the smallest block one
//!   subscriber holds (SLAAC needs a whole /64 per link; RFC 6177 advises giving an end
//!   site more than one /64, and RIPE-690 a /56 or /48 per customer), so keying by address
//!   would give one IPv6 subscriber 2^64 keys. [`Prefix::FULL`] keys every address apart
//!   (for clients of a carrier that puts many subscribers in one /64); a /56 or /48
//!   ([`Prefix::new`]) keys a whole customer assignment together.
//! - **Header keys are capped.** [`Header`](struct@Header) takes a value of at most 256
//!   bytes ([`Header::max_len`]) of visible ASCII; any other value is no key, and the
//!   policy's [`MissingKey`](super::MissingKey) applies.

use std::hash::Hash;
use std::marker::PhantomData;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use http::{HeaderMap, HeaderName, Request};

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

/// The peer's IP address, masked to a [`Prefix`] (/32 for IPv4, /64 for IPv6 by default;
/// see the [module docs](self)): from axum's `ConnectInfo<SocketAddr>` (feature `axum`;
/// serve with `into_make_service_with_connect_info::<SocketAddr>()`), from a plain
/// [`SocketAddr`] request extension (what a hand-written hyper server can insert), or from
/// tonic's `TcpConnectInfo` (feature `tonic`: what a tonic server serving plain TCP puts on
/// every request; over TLS tonic puts a `TlsConnectInfo` instead, which a [`from_fn`] can
/// read).
///
/// `PeerIp` is both the type and its default value (a constant of the same name), so
/// `key::PeerIp` is the extractor with the default prefixes and `key::PeerIp.prefix(..)`
/// one with others:
///
/// ```
/// use std::net::{IpAddr, SocketAddr};
/// use turnstile::tower::key::{KeyExtractor, PeerIp, Prefix};
///
/// let mut req = http::Request::new(());
/// req.extensions_mut()
///     .insert("[2001:db8:1:2::7]:5000".parse::<SocketAddr>().unwrap());
/// // The subscriber's /64 by default, the address itself at /128.
/// assert_eq!(PeerIp.extract(&req), Some("2001:db8:1:2::".parse::<IpAddr>().unwrap()));
/// let per_address = PeerIp.prefix(Prefix::FULL);
/// assert_eq!(per_address.extract(&req), Some("2001:db8:1:2::7".parse::<IpAddr>().unwrap()));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerIp {
    prefix: Prefix,
}

/// [`PeerIp`](struct@PeerIp) with the default prefixes ([`Prefix::DEFAULT`]).
#[allow(non_upper_case_globals)] // named for its type, as a unit struct's value would be
pub const PeerIp: PeerIp = PeerIp {
    prefix: Prefix::DEFAULT,
};

impl PeerIp {
    /// This extractor keying by `prefix` instead.
    pub fn prefix(self, prefix: Prefix) -> PeerIp {
        PeerIp { prefix }
    }
}

impl Default for PeerIp {
    fn default() -> Self {
        PeerIp
    }
}

/// The peer address of `req`, from the extensions [`PeerIp`](struct@PeerIp) reads.
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
        peer_addr(req).map(|a| self.prefix.apply(a.ip()))
    }
}

/// How much of a client's address is its key: the network of `v4` leading bits for an IPv4
/// client, of `v6` for an IPv6 one. The key is that network's address (`2001:db8:1:2::` for
/// `2001:db8:1:2::7` at /64), so every address of one network is one client.
///
/// The default, [`Prefix::DEFAULT`], is /32 and /64: an IPv4 address is one client (or one
/// NAT), and a /64 is the smallest block an IPv6 subscriber holds (see the
/// [module docs](self)). [`Prefix::FULL`] keys every IPv6 address apart; `Prefix::new(32,
/// 56)` or `(32, 48)` a whole customer assignment together.
///
/// ```
/// use std::net::IpAddr;
/// use turnstile::tower::key::Prefix;
///
/// let ip = |s: &str| s.parse::<IpAddr>().unwrap();
/// assert_eq!(Prefix::DEFAULT.apply(ip("2001:db8:1:2::7")), ip("2001:db8:1:2::"));
/// assert_eq!(Prefix::DEFAULT.apply(ip("192.0.2.7")), ip("192.0.2.7"));
/// let p = Prefix::new(24, 48).unwrap();
/// assert_eq!(p.apply(ip("2001:db8:1:2::7")), ip("2001:db8:1::"));
/// assert_eq!(p.apply(ip("192.0.2.7")), ip("192.0.2.0"));
/// assert!(Prefix::new(32, 129).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Prefix {
    v4: u8,
    v6: u8,
}

/// Why a [`Prefix`] was refused: a length longer than its address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("prefix lengths /{v4} (IPv4) and /{v6} (IPv6) out of range: at most /32 and /128")]
pub struct PrefixError {
    v4: u8,
    v6: u8,
}

impl Prefix {
    /// /32 for IPv4, /64 for IPv6: one key per IPv4 address and per IPv6 subscriber.
    pub const DEFAULT: Prefix = Prefix { v4: 32, v6: 64 };
    /// /32 and /128: one key per address.
    pub const FULL: Prefix = Prefix { v4: 32, v6: 128 };

    /// Networks of `v4` bits (0..=32) for IPv4 clients and `v6` bits (0..=128) for IPv6
    /// ones; zero makes every client of that family one key.
    pub const fn new(v4: u8, v6: u8) -> Result<Prefix, PrefixError> {
        if v4 > 32 || v6 > 128 {
            return Err(PrefixError { v4, v6 });
        }
        Ok(Prefix { v4, v6 })
    }

    /// The IPv4 length.
    pub const fn v4(self) -> u8 {
        self.v4
    }

    /// The IPv6 length.
    pub const fn v6(self) -> u8 {
        self.v6
    }

    /// The network of `ip` (an IPv4-mapped IPv6 address as the IPv4 address it maps).
    #[inline]
    pub fn apply(self, ip: IpAddr) -> IpAddr {
        match canonical(ip) {
            IpAddr::V4(v4) => IpAddr::V4((u32::from(v4) & mask32(self.v4)).into()),
            IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & mask128(self.v6)).into()),
        }
    }
}

impl Default for Prefix {
    fn default() -> Self {
        Prefix::DEFAULT
    }
}

/// The leading `bits` of 32 set (`bits` at most 32).
#[inline]
fn mask32(bits: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0)
}

/// The leading `bits` of 128 set (`bits` at most 128).
#[inline]
fn mask128(bits: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0)
}

/// The header a [`ForwardedIp`] reads, and how.
#[derive(Debug, Clone)]
enum Source {
    /// A comma-separated list of addresses, one per proxy, appended left to right.
    XForwardedFor,
    /// RFC 7239: a list of elements, each `;`-separated `name=value` pairs, the client in
    /// `for=`.
    Forwarded,
    /// One address, set (not appended to) by the trusted peer.
    Single(HeaderName),
}

/// The client's address as trusted proxies report it, masked to a [`Prefix`]: read from the
/// one header named at construction, only when the peer is a trusted proxy, walked from the
/// right past trusted proxies to the first address that is not one (see the
/// [module docs](self) for every rule: ports, unreadable hops, prefixes). From any other
/// peer the header is ignored and the key is the peer's address, so a client cannot pick its
/// own key.
///
/// ```
/// use std::net::{IpAddr, SocketAddr};
/// use turnstile::tower::key::{Cidr, ForwardedIp, KeyExtractor, Prefix};
///
/// // Behind nginx at 10.0.0.2, which appends the client's address to X-Forwarded-For.
/// let trusted = ["10.0.0.2".parse::<Cidr>().unwrap()];
/// let key = ForwardedIp::x_forwarded_for(trusted);
/// let mut req = http::Request::get("/")
///     .header("x-forwarded-for", "6.6.6.6, 192.0.2.7:5000") // the client wrote 6.6.6.6
///     .header("forwarded", "for=6.6.6.7") // and this, which is never read here
///     .body(())
///     .unwrap();
/// req.extensions_mut()
///     .insert("10.0.0.2:41000".parse::<SocketAddr>().unwrap());
/// assert_eq!(key.extract(&req), Some("192.0.2.7".parse::<IpAddr>().unwrap()));
///
/// // Behind Cloudflare, which sets CF-Connecting-IP, keying every IPv6 address apart.
/// let cloudflare = ["173.245.48.0/20".parse::<Cidr>().unwrap()]; // and its other ranges
/// let key = ForwardedIp::header(http::HeaderName::from_static("cf-connecting-ip"), cloudflare)
///     .prefix(Prefix::FULL);
/// # let _ = key;
/// ```
#[derive(Debug, Clone)]
pub struct ForwardedIp {
    trusted: Vec<Cidr>,
    source: Source,
    prefix: Prefix,
}

impl ForwardedIp {
    /// The most hops of a chain the walk reads: real chains have a handful, and a longer one
    /// of trusted proxies stops the walk as an unreadable hop does (its key is the last of
    /// them read), so a request's cost is bounded whatever its headers.
    pub const MAX_HOPS: usize = 32;

    /// Reads `X-Forwarded-For` (every line of it, as one list) from the proxies in `trusted`
    /// (networks, e.g. `10.0.0.0/8`, or single addresses): what nginx
    /// (`$proxy_add_x_forwarded_for`), AWS ALB, Envoy and Cloudflare append to, and the
    /// usual choice.
    pub fn x_forwarded_for(trusted: impl IntoIterator<Item = Cidr>) -> Self {
        Self::reading(Source::XForwardedFor, trusted)
    }

    /// Reads `Forwarded` (RFC 7239; its `for=` parameters) from the proxies in `trusted`.
    pub fn forwarded(trusted: impl IntoIterator<Item = Cidr>) -> Self {
        Self::reading(Source::Forwarded, trusted)
    }

    /// Reads `name`, a header holding one address that the proxies in `trusted` set,
    /// replacing what the client sent (nginx's `X-Real-IP` set to `$remote_addr`,
    /// Cloudflare's `CF-Connecting-IP`, Akamai's `True-Client-IP`). Where a request carries
    /// several (lines, or a comma-separated list: a proxy that appended instead), the last
    /// is read, the one the nearest proxy wrote; one that cannot be read makes the peer the
    /// key.
    pub fn header(name: HeaderName, trusted: impl IntoIterator<Item = Cidr>) -> Self {
        Self::reading(Source::Single(name), trusted)
    }

    fn reading(source: Source, trusted: impl IntoIterator<Item = Cidr>) -> Self {
        ForwardedIp {
            trusted: trusted.into_iter().collect(),
            source,
            prefix: Prefix::DEFAULT,
        }
    }

    /// This extractor keying by `prefix` instead of [`Prefix::DEFAULT`]. Trusted proxies
    /// are still matched on whole addresses.
    pub fn prefix(mut self, prefix: Prefix) -> Self {
        self.prefix = prefix;
        self
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|c| c.contains(ip))
    }

    /// The client's whole address, for a request from `peer` with these headers.
    fn client(&self, headers: &HeaderMap, peer: IpAddr) -> IpAddr {
        if !self.is_trusted(peer) {
            return peer;
        }
        let name = match &self.source {
            Source::XForwardedFor => &X_FORWARDED_FOR,
            Source::Forwarded => &http::header::FORWARDED,
            Source::Single(name) => {
                // The last element of the last line: what the nearest proxy wrote.
                let last = headers.get_all(name).iter().next_back();
                return last
                    .and_then(|v| v.as_bytes().rsplit(|&b| b == b',').next())
                    .and_then(parse_node)
                    .unwrap_or(peer);
            }
        };
        // The chain is every hop of every line, left to right; walked here from the right
        // (lines and elements each in reverse) in place, with no list of it built. Every
        // trusted hop vouches for the one to its left, so the first untrusted one is the
        // client; `vouched` is the last trusted hop passed, the key when the walk stops
        // before it (a hop it cannot read, too many hops) or runs out of hops.
        let mut vouched = peer;
        let mut hops = 0;
        for line in headers.get_all(name).iter().rev() {
            for element in line.as_bytes().rsplit(|&b| b == b',') {
                hops += 1;
                if hops > Self::MAX_HOPS {
                    return vouched;
                }
                let node = match self.source {
                    Source::Forwarded => forwarded_for(element),
                    _ => Some(element),
                };
                let Some(ip) = node.and_then(parse_node) else {
                    return vouched;
                };
                if !self.is_trusted(ip) {
                    return ip;
                }
                vouched = ip;
            }
        }
        vouched
    }
}

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

impl KeyType for ForwardedIp {
    type Key = IpAddr;
}

impl<B> KeyExtractor<B> for ForwardedIp {
    fn extract(&self, req: &Request<B>) -> Option<IpAddr> {
        // An IPv4-mapped peer or hop needs no conversion here: trusted networks match it
        // (`Cidr::contains`) and keys mask it (`Prefix::apply`) as the IPv4 address it maps.
        let peer = peer_addr(req)?.ip();
        Some(self.prefix.apply(self.client(req.headers(), peer)))
    }
}

/// The node of a `Forwarded` element's one `for=` parameter; `None` for an element with
/// none, with several (RFC 7239 allows one), or with a parameter that is not `name=value`.
fn forwarded_for(element: &[u8]) -> Option<&[u8]> {
    let mut node = None;
    for pair in element.split(|&b| b == b';') {
        let pair = pair.trim_ascii();
        if pair.is_empty() {
            continue;
        }
        let eq = pair.iter().position(|&b| b == b'=')?;
        if pair[..eq].eq_ignore_ascii_case(b"for") {
            if node.is_some() {
                return None;
            }
            node = Some(&pair[eq + 1..]);
        }
    }
    node
}

/// One hop: `192.0.2.7`, `192.0.2.7:5000`, `2001:db8::7`, `[2001:db8::7]`,
/// `[2001:db8::7]:4711`, optionally in double quotes, the port digits or an obfuscated
/// `_name` (RFC 7239's node syntax, which covers every proxy's). `None` for anything else:
/// `unknown`, an obfuscated node, an empty one, a zone id, bytes that are not text.
fn parse_node(node: &[u8]) -> Option<IpAddr> {
    let node = node.trim_ascii();
    let node = match node {
        [b'"', inner @ .., b'"'] => inner,
        _ => node,
    };
    let (host, port, bracketed) = if let Some(rest) = node.strip_prefix(b"[") {
        let end = rest.iter().position(|&b| b == b']')?;
        let port = match &rest[end + 1..] {
            [] => None,
            [b':', port @ ..] => Some(port),
            _ => return None,
        };
        (&rest[..end], port, true)
    } else {
        // One colon: IPv4 and a port. More: a bare IPv6 address, no port.
        let mut colons = node.iter().enumerate().filter(|&(_, &b)| b == b':');
        match (colons.next(), colons.next()) {
            (Some((at, _)), None) => (&node[..at], Some(&node[at + 1..]), false),
            _ => (node, None, false),
        }
    };
    if !port.is_none_or(is_port) {
        return None;
    }
    let ip = IpAddr::from_str(std::str::from_utf8(host).ok()?).ok()?;
    if bracketed && !ip.is_ipv6() {
        return None;
    }
    Some(ip)
}

/// A port: 0..=65535 in decimal, or an obfuscated `_name` (RFC 7239's obfport).
fn is_port(port: &[u8]) -> bool {
    match port {
        [b'_', name @ ..] => {
            !name.is_empty()
                && name
                    .iter()
                    .all(|&b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        }
        _ => {
            (1..=5).contains(&port.len())
                && port.iter().all(u8::is_ascii_digit)
                && port.iter().fold(0u32, |n, &d| n * 10 + u32::from(d - b'0')) <= 65535
        }
    }
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
                let mask = mask32(self.prefix);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = mask128(self.prefix);
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

/// The value of a request header (e.g. an API key), as a `String`: `Header(name)`, at most
/// 256 bytes by default ([`Header::max_len`] sets another cap).
/// A request without the header, or whose (first) value is empty, longer than the cap, or
/// not visible ASCII (spaces allowed), has no key: the policy's
/// [`MissingKey`](super::MissingKey) choice applies.
///
/// **Refuse keyless requests.** A client chooses this key: it can send a new value on every
/// request, so a limit per header value bounds only clients that keep theirs, and under
/// [`MissingKey::Allow`](super::MissingKey::Allow), `per_key`'s default, a client that omits
/// the header or garbles it (257 bytes, a byte that is not text) skips the limit altogether.
/// Put header-keyed limits under [`MissingKey::Deny`](super::MissingKey::Deny), or
/// [`MissingKey::As`](super::MissingKey::As) to share one limit among every keyless request,
/// and behind a limit the client cannot steer (per [`PeerIp`](struct@PeerIp) or
/// [`ForwardedIp`]).
///
/// ```
/// use http::HeaderName;
/// use turnstile::tower::key::{Header, KeyExtractor};
/// use turnstile::tower::{per_key, MissingKey};
/// use turnstile::{KeyedTokenBucket, Limit};
///
/// let api_key = Header(HeaderName::from_static("x-api-key")).max_len(64);
/// let req = |v: &str| http::Request::get("/").header("x-api-key", v).body(()).unwrap();
/// assert_eq!(api_key.extract(&req("k-1")).as_deref(), Some("k-1"));
/// assert_eq!(api_key.extract(&req(&"k".repeat(65))), None);
///
/// let per_api_key = per_key(
///     "per-api-key",
///     api_key,
///     KeyedTokenBucket::new(Limit::per_second(10.0).unwrap(), 20),
/// )
/// .on_missing_key(MissingKey::Deny);
/// # let _ = per_api_key;
/// ```
#[derive(Debug, Clone)]
pub struct Header {
    name: HeaderName,
    max_len: usize,
}

/// A [`Header`](struct@Header) extractor of `name`, capped at 256 bytes.
#[allow(non_snake_case)] // named for its type, as a tuple struct's constructor would be
pub fn Header(name: HeaderName) -> Header {
    Header {
        name,
        max_len: Header::DEFAULT_MAX_LEN,
    }
}

impl Header {
    /// The default cap on a key's length, in bytes: room for any API key or token
    /// identifier, and a bound on what one key costs a map (or a Redis key).
    pub(crate) const DEFAULT_MAX_LEN: usize = 256;

    /// This extractor with a cap of `max_len` bytes instead of the default 256: room for any
    /// API key or token identifier, and a bound on what one key costs a map (or a Redis key).
    pub fn max_len(mut self, max_len: usize) -> Self {
        self.max_len = max_len;
        self
    }

    /// The header read.
    pub fn name(&self) -> &HeaderName {
        &self.name
    }
}

impl KeyType for Header {
    type Key = String;
}

impl<B> KeyExtractor<B> for Header {
    fn extract(&self, req: &Request<B>) -> Option<String> {
        let v = req.headers().get(&self.name)?.as_bytes();
        if v.is_empty() || v.len() > self.max_len || !v.iter().all(|&b| (b' '..=b'~').contains(&b))
        {
            return None;
        }
        // Visible ASCII: UTF-8 already.
        std::str::from_utf8(v).ok().map(str::to_owned)
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
mod tests;
