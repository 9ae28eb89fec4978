use super::*;

fn req(peer: &str, headers: &[(&str, &[u8])]) -> Request<()> {
    let mut r = Request::get("/").body(()).unwrap();
    for (k, v) in headers {
        r.headers_mut().append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            http::HeaderValue::from_bytes(v).unwrap(),
        );
    }
    r.extensions_mut()
        .insert(peer.parse::<SocketAddr>().unwrap());
    r
}

fn trusted() -> [Cidr; 2] {
    ["10.0.0.0/8".parse().unwrap(), "::1".parse().unwrap()]
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The key `x` gives a request from 10.0.0.2 (trusted) with `name: line` for each line.
fn key(x: &ForwardedIp, name: &str, lines: &[&[u8]]) -> String {
    let headers: Vec<_> = lines.iter().map(|l| (name, *l)).collect();
    x.extract(&req("10.0.0.2:5000", &headers))
        .unwrap()
        .to_string()
}

fn xff(lines: &[&str]) -> String {
    let lines: Vec<_> = lines.iter().map(|l| l.as_bytes()).collect();
    key(
        &ForwardedIp::x_forwarded_for(trusted()),
        "x-forwarded-for",
        &lines,
    )
}

fn fwd(lines: &[&str]) -> String {
    let lines: Vec<_> = lines.iter().map(|l| l.as_bytes()).collect();
    key(&ForwardedIp::forwarded(trusted()), "forwarded", &lines)
}

#[test]
fn nodes() {
    let node = |s: &str| parse_node(s.as_bytes()).map(|ip| ip.to_string());
    for (text, want) in [
        ("192.0.2.7", "192.0.2.7"),
        (" 192.0.2.7\t", "192.0.2.7"),
        ("192.0.2.7:5000", "192.0.2.7"),
        ("192.0.2.7:0", "192.0.2.7"),
        ("192.0.2.7:65535", "192.0.2.7"),
        ("\"192.0.2.7:5000\"", "192.0.2.7"),
        ("192.0.2.7:_p-1.x", "192.0.2.7"),
        ("2001:db8::7", "2001:db8::7"),
        ("[2001:db8::7]", "2001:db8::7"),
        ("[2001:db8::7]:4711", "2001:db8::7"),
        ("\"[2001:db8::7]:4711\"", "2001:db8::7"),
        ("[2001:db8::7]:_hidden", "2001:db8::7"),
        ("::ffff:192.0.2.7", "::ffff:192.0.2.7"),
        ("[::ffff:192.0.2.7]:80", "::ffff:192.0.2.7"),
    ] {
        assert_eq!(node(text).as_deref(), Some(want), "{text:?}");
    }
    for text in [
        "",
        " ",
        "\"\"",
        "unknown",
        "_hidden",
        "192.0.2.7:",
        "192.0.2.7:65536",
        "192.0.2.7:123456",
        "192.0.2.7:-1",
        "192.0.2.7:_",
        "192.0.2.7:_a,b",
        "192.0.2.7x",
        "192.0.2",
        "[192.0.2.7]",
        "[192.0.2.7]:80",
        "[2001:db8::7",
        "[2001:db8::7]x",
        "[2001:db8::7]:",
        "2001:db8::7:4711x",
        "\"192.0.2.7",
        "fe80::1%eth0",
        "[fe80::1%25eth0]:80",
        "192.0.2.7\u{ff}",
    ] {
        assert_eq!(node(text), None, "{text:?}");
    }
    assert_eq!(parse_node(b"192.0.2.7\xff"), None);
}

#[test]
fn forwarded_elements() {
    fn node(s: &str) -> Option<&str> {
        forwarded_for(s.as_bytes()).map(|n| std::str::from_utf8(n).unwrap())
    }
    assert_eq!(node("for=192.0.2.7"), Some("192.0.2.7"));
    assert_eq!(
        node(" For=\"[::1]:80\" ; proto=https"),
        Some("\"[::1]:80\"")
    );
    assert_eq!(node("by=10.0.0.1;for=192.0.2.7;"), Some("192.0.2.7"));
    assert_eq!(node("proto=https;by=10.0.0.1"), None);
    assert_eq!(node("for=1.2.3.4;for=5.6.7.8"), None);
    assert_eq!(node("for=1.2.3.4;junk"), None);
    assert_eq!(node(""), None);
}

#[test]
fn a_forged_header_from_an_untrusted_peer_is_ignored() {
    let direct = "203.0.113.9:5000";
    for x in [
        ForwardedIp::x_forwarded_for(trusted()),
        ForwardedIp::forwarded(trusted()),
        ForwardedIp::header(HeaderName::from_static("x-real-ip"), trusted()),
    ] {
        let r = req(
            direct,
            &[
                ("x-forwarded-for", b"1.2.3.4"),
                ("forwarded", b"for=1.2.3.5"),
                ("x-real-ip", b"1.2.3.6"),
            ],
        );
        assert_eq!(x.extract(&r), Some(ip("203.0.113.9")), "{x:?}");
    }
}

#[test]
fn only_the_named_header_is_read() {
    let both: &[(&str, &[u8])] = &[
        ("forwarded", b"for=6.6.6.6"),
        ("x-forwarded-for", b"198.51.100.7"),
        ("x-real-ip", b"198.51.100.8"),
    ];
    let r = req("10.0.0.2:5000", both);
    let xff = ForwardedIp::x_forwarded_for(trusted());
    assert_eq!(xff.extract(&r), Some(ip("198.51.100.7")));
    let fwd = ForwardedIp::forwarded(trusted());
    assert_eq!(fwd.extract(&r), Some(ip("6.6.6.6")));
    let real = ForwardedIp::header(HeaderName::from_static("x-real-ip"), trusted());
    assert_eq!(real.extract(&r), Some(ip("198.51.100.8")));
    // The named header absent: the peer, never another header.
    let r = req("10.0.0.2:5000", &[("forwarded", b"for=6.6.6.6")]);
    assert_eq!(xff.extract(&r), Some(ip("10.0.0.2")));
    assert_eq!(real.extract(&r), Some(ip("10.0.0.2")));
}

#[test]
fn through_trusted_proxies_the_rightmost_untrusted_hop_is_the_client() {
    // The client wrote "6.6.6.6" itself; the edge proxy appended the real client.
    assert_eq!(xff(&["6.6.6.6, 198.51.100.7, 10.0.0.1"]), "198.51.100.7");
    assert_eq!(
        xff(&["6.6.6.6, 198.51.100.7:5000, 10.0.0.1"]),
        "198.51.100.7"
    );
    assert_eq!(
        fwd(&["for=6.6.6.6, for=\"[2001:db8::7]:4711\";proto=https, for=10.0.0.1"]),
        "2001:db8::"
    );
    // A trusted peer with no header is the client itself.
    let r = req("[::1]:5000", &[]);
    let x = ForwardedIp::x_forwarded_for(trusted()).prefix(Prefix::FULL);
    assert_eq!(x.extract(&r), Some(ip("::1")));
}

#[test]
fn the_chain_runs_across_header_lines_and_ends_at_its_leftmost_hop() {
    // Lines in order, each read left to right: one chain.
    assert_eq!(xff(&["6.6.6.6, 198.51.100.7", "10.0.0.1"]), "198.51.100.7");
    assert_eq!(xff(&["198.51.100.7", "10.0.0.1, 10.0.0.3"]), "198.51.100.7");
    assert_eq!(
        fwd(&["for=6.6.6.6", "for=198.51.100.7", "for=10.0.0.1"]),
        "198.51.100.7"
    );
    // Every hop trusted: the leftmost.
    assert_eq!(xff(&["10.0.0.5, 10.0.0.1", "10.0.0.3"]), "10.0.0.5");
}

#[test]
fn an_unreadable_hop_is_the_trusted_hop_to_its_right() {
    for tail in [
        "junk",
        "unknown",
        "_hidden",
        "",
        " ",
        "1.2.3.4:99999",
        "[::1",
    ] {
        // Written by the peer: the peer.
        assert_eq!(
            xff(&[&format!("198.51.100.7, {tail}")]),
            "10.0.0.2",
            "{tail:?}"
        );
        // Written by the proxy 10.0.0.1 that the peer vouches for: that proxy.
        assert_eq!(
            xff(&[&format!("198.51.100.7, {tail}, 10.0.0.1")]),
            "10.0.0.1",
            "{tail:?}"
        );
    }
    for tail in [
        "for=unknown",
        "for=_hidden",
        "proto=https",
        "for=1.1.1.1;for=2.2.2.2",
        "for",
    ] {
        assert_eq!(
            fwd(&[&format!("for=198.51.100.7, {tail}")]),
            "10.0.0.2",
            "{tail:?}"
        );
    }
    // An empty line is an empty element.
    assert_eq!(xff(&["198.51.100.7", ""]), "10.0.0.2");
    // Bytes that are not text: unreadable where the walk meets them, unread left of
    // the client.
    let x = ForwardedIp::x_forwarded_for(trusted());
    assert_eq!(
        key(&x, "x-forwarded-for", &[b"198.51.100.7", b"\xff"]),
        "10.0.0.2"
    );
    assert_eq!(
        key(&x, "x-forwarded-for", &[b"\xff\xfe, 198.51.100.7"]),
        "198.51.100.7"
    );
    assert_eq!(
        key(&x, "x-forwarded-for", &[b"\xff", b"198.51.100.7"]),
        "198.51.100.7"
    );
    // Empty elements left of the client are never reached.
    assert_eq!(xff(&[",,6.6.6.6,,198.51.100.7"]), "198.51.100.7");
}

#[test]
fn the_walk_reads_at_most_max_hops() {
    let chain = |trusted_hops: usize| {
        let mut v = "198.51.100.7".to_string();
        for i in 0..trusted_hops {
            v.push_str(&format!(", 10.0.0.{}", i % 250 + 3));
        }
        xff(&[&v])
    };
    assert_eq!(chain(ForwardedIp::MAX_HOPS - 1), "198.51.100.7");
    // The client is hop MAX_HOPS + 1: the walk stops at the last trusted hop it read,
    // the leftmost of the MAX_HOPS (10.0.0.3 + 0, read last).
    assert_eq!(chain(ForwardedIp::MAX_HOPS), "10.0.0.3");
    assert_eq!(
        chain(1000),
        format!("10.0.0.{}", (1000 - ForwardedIp::MAX_HOPS) % 250 + 3)
    );
}

#[test]
fn a_single_address_header_is_its_last_value() {
    let real = ForwardedIp::header(HeaderName::from_static("x-real-ip"), trusted());
    let k = |lines: &[&[u8]]| key(&real, "x-real-ip", lines);
    assert_eq!(k(&[b"198.51.100.7"]), "198.51.100.7");
    assert_eq!(k(&[b"\"[2001:db8::7]:443\""]), "2001:db8::");
    assert_eq!(k(&[b"6.6.6.6", b"198.51.100.7"]), "198.51.100.7");
    assert_eq!(k(&[b"6.6.6.6, 198.51.100.7"]), "198.51.100.7");
    // A trusted address in it is still the client: it is not a chain.
    assert_eq!(k(&[b"10.9.9.9"]), "10.9.9.9");
    for bad in [
        &b"unknown"[..],
        b"",
        b"198.51.100.7, ",
        b"\xff",
        b"1.2.3.4:x",
    ] {
        assert_eq!(k(&[bad]), "10.0.0.2", "{bad:?}");
    }
    assert_eq!(k(&[]), "10.0.0.2");
}

#[test]
fn prefixes() {
    let v6 = req("[2001:db8:1:2:3:4:5:6]:80", &[]);
    let v4 = req("192.0.2.77:80", &[]);
    let mapped = req("[::ffff:192.0.2.77]:80", &[]);
    assert_eq!(PeerIp.extract(&v6), Some(ip("2001:db8:1:2::")));
    assert_eq!(PeerIp::default().extract(&v6), Some(ip("2001:db8:1:2::")));
    assert_eq!(PeerIp.extract(&v4), Some(ip("192.0.2.77")));
    assert_eq!(PeerIp.extract(&mapped), Some(ip("192.0.2.77")));
    let full = PeerIp.prefix(Prefix::FULL);
    assert_eq!(full.extract(&v6), Some(ip("2001:db8:1:2:3:4:5:6")));
    let wide = PeerIp.prefix(Prefix::new(16, 48).unwrap());
    assert_eq!(wide.extract(&v6), Some(ip("2001:db8:1::")));
    assert_eq!(wide.extract(&mapped), Some(ip("192.0.0.0")));
    let none = Prefix::new(0, 0).unwrap();
    assert_eq!(none.apply(ip("2001:db8::1")), ip("::"));
    assert_eq!(none.apply(ip("192.0.2.1")), ip("0.0.0.0"));
    let odd = Prefix::new(31, 127).unwrap();
    assert_eq!(odd.apply(ip("192.0.2.77")), ip("192.0.2.76"));
    assert_eq!(odd.apply(ip("2001:db8::7")), ip("2001:db8::6"));
    assert_eq!(Prefix::new(33, 64), Err(PrefixError { v4: 33, v6: 64 }));
    assert!(Prefix::new(32, 129).is_err());
    assert_eq!(Prefix::default(), Prefix::DEFAULT);
    assert_eq!((Prefix::DEFAULT.v4(), Prefix::DEFAULT.v6()), (32, 64));
    // ForwardedIp masks the client, and matches trusted proxies on whole addresses:
    // ::1 is trusted, ::2 (the same /64) is not.
    let x = ForwardedIp::x_forwarded_for(trusted());
    let r = req("[::1]:80", &[("x-forwarded-for", b"2001:db8:1:2::9, ::2")]);
    assert_eq!(x.extract(&r), Some(ip("::")));
    let x = x.prefix(Prefix::FULL);
    assert_eq!(x.extract(&r), Some(ip("::2")));
}

#[test]
fn header_keys_are_capped_visible_ascii() {
    let h = Header(HeaderName::from_static("x-api-key"));
    let k = |v: &[u8]| h.extract(&req("192.0.2.1:1", &[("x-api-key", v)]));
    assert_eq!(k(b"key 1").as_deref(), Some("key 1"));
    let max = "k".repeat(Header::DEFAULT_MAX_LEN);
    assert_eq!(k(max.as_bytes()), Some(max.clone()));
    assert_eq!(k(format!("{max}k").as_bytes()), None);
    for bad in [&b""[..], b"a\tb", b"caf\xc3\xa9", b"\xff"] {
        assert_eq!(k(bad), None, "{bad:?}");
    }
    assert_eq!(h.extract(&req("192.0.2.1:1", &[])), None);
    let short = h.clone().max_len(3);
    assert_eq!(short.name(), "x-api-key");
    let r = req("192.0.2.1:1", &[("x-api-key", b"abcd")]);
    assert_eq!(short.extract(&r), None);
    assert_eq!(h.extract(&r).as_deref(), Some("abcd"));
}

#[test]
fn cidrs() {
    let c: Cidr = "10.0.0.0/8".parse().unwrap();
    assert!(c.contains(ip("10.255.0.1")));
    assert!(!c.contains(ip("11.0.0.1")));
    assert!(c.contains(ip("::ffff:10.1.2.3")));
    let all: Cidr = "0.0.0.0/0".parse().unwrap();
    assert!(all.contains(ip("1.2.3.4")));
    assert!("10.0.0.0/33".parse::<Cidr>().is_err());
    assert!("nope".parse::<Cidr>().is_err());
    let one: Cidr = "2001:db8::1".parse().unwrap();
    assert!(one.contains(ip("2001:db8::1")));
    assert!(!one.contains(ip("2001:db8::2")));
}
