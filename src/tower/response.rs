//! What the layer writes: a refusal (HTTP or gRPC) and the IETF `RateLimit` headers.

use super::*;

/// `RateLimit-Policy`.
pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`.
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
static GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

/// Whether a request is gRPC (`content-type: application/grpc`, `application/grpc+proto`…).
pub(super) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// The response to refused `req` (its body the text to send, `""` for gRPC).
pub(super) fn refusal<B>(
    config: &Config,
    denied: &Denied,
    report: &Report,
    req: &Request<B>,
) -> Response<Bytes> {
    let grpc = config.grpc && is_grpc(req.headers());
    // gRPC's refusal has no body: its status is in the headers (a "trailers-only" response).
    let mut resp = Response::new(if grpc {
        Bytes::new()
    } else {
        config.body.clone()
    });
    if grpc {
        // gRPC's "trailers-only" response: the status in the headers of an empty 200.
        let h = resp.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        h.insert(GRPC_STATUS.clone(), HeaderValue::from_static("8"));
        h.insert(
            GRPC_MESSAGE.clone(),
            HeaderValue::from_static("rate%20limited"),
        );
    } else {
        *resp.status_mut() = config.status;
        resp.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
    }
    if let Some(secs) = denied.retry_after_secs() {
        resp.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(secs));
    }
    if config.headers != Headers::Never {
        write_report(resp.headers_mut(), report);
    }
    resp
}

/// `RateLimit-Policy` and `RateLimit` from `report` (nothing if it is empty): every item in
/// the first, the binding ones ([`ReportItem::binding`]) in the second. Bytes, not `fmt`: on
/// a refusal these two values are most of the layer's work, and `write!` costs several times
/// a plain digit loop.
pub(super) fn write_report(headers: &mut HeaderMap, report: &Report) {
    if report.items.is_empty() {
        return;
    }
    let mut policy = Vec::with_capacity(32 * report.items.len());
    let mut state = Vec::with_capacity(32 * report.items.len());
    for item in &report.items {
        let (name, s) = (&item.name, &item.status);
        if !policy.is_empty() {
            policy.extend_from_slice(b", ");
        }
        write_sf_string(&mut policy, name);
        policy.extend_from_slice(b";q=");
        write_u64(&mut policy, s.quota);
        policy.extend_from_slice(b";w=");
        write_u64(&mut policy, s.window_secs());
        if !item.binding {
            continue;
        }
        if !state.is_empty() {
            state.extend_from_slice(b", ");
        }
        write_sf_string(&mut state, name);
        state.extend_from_slice(b";r=");
        write_u64(&mut state, s.remaining);
        state.extend_from_slice(b";t=");
        write_u64(&mut state, s.reset_secs());
    }
    if let Ok(p) = HeaderValue::try_from(policy) {
        headers.insert(RATELIMIT_POLICY.clone(), p);
    }
    // Empty only if no item is binding (a report built by hand): then no `RateLimit`, which
    // is a non-empty list.
    if !state.is_empty() {
        if let Ok(s) = HeaderValue::try_from(state) {
            headers.insert(RATELIMIT.clone(), s);
        }
    }
}

/// A structured-field string (RFC 8941 §3.3.3): quoted, `"` and `\` escaped; other bytes
/// outside visible ASCII dropped (a policy name is the server's own text; a character beyond
/// ASCII is dropped whole, all its bytes being above 0x7e).
pub(super) fn write_sf_string(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    if bytes
        .iter()
        .all(|&b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\')
    {
        out.extend_from_slice(bytes);
    } else {
        for &b in bytes {
            match b {
                b'"' | b'\\' => out.extend_from_slice(&[b'\\', b]),
                b' '..=b'~' => out.push(b),
                _ => {}
            }
        }
    }
    out.push(b'"');
}

/// `n` in decimal.
pub(super) fn write_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}
