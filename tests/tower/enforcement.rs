//! Enforcement modes (`PolicyExt::enforcement`): shadow mode refuses nothing and counts
//! exactly what enforcement refuses, on limiters that follow the same path; a fraction
//! enforces a stable set of clients that only grows with the fraction; the mode changes at
//! run time under a built layer; under `And` a shadow refusal is a pass; delay mode does not
//! hold a client that is not enforced; counts are exact across threads.
#![cfg(all(feature = "tower", feature = "axum"))]

use std::hash::{BuildHasherDefault, DefaultHasher};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{Request, StatusCode};
use turnstile::tower::{
    global, key, per_key, Ask, Counts, Enforcement, Mode, Policy, PolicyExt, RateLimitLayer,
};
use turnstile::{ConfigError, KeyedTokenBucket, Limit, ManualClock, Nanos, TokenBucket};

use crate::multi::{get_req, send, service};

const START: Nanos = Nanos::new(1_000_000_000);

/// 10 a second, bursts of 5, on `clock`.
fn bucket(clock: &ManualClock) -> TokenBucket<ManualClock> {
    TokenBucket::builder(Limit::per_second(10.0).unwrap(), 5)
        .clock(clock.clone())
        .build()
}

fn counts(allowed: u64, refused: u64, shadow_refused: u64) -> Counts {
    Counts {
        allowed,
        refused,
        shadow_refused,
    }
}

#[tokio::test]
async fn shadow_refuses_nothing_and_counts_exactly_what_enforcement_refuses() {
    let (ce, cs) = (ManualClock::new(START), ManualClock::new(START));
    let enforced =
        RateLimitLayer::new(global("all", bucket(&ce)).enforcement(Enforcement::enforce()));
    let shadow = RateLimitLayer::new(global("all", bucket(&cs)).enforcement(Enforcement::shadow()));
    let (mut se, mut ss) = (service(enforced.clone()), service(shadow.clone()));
    // About 20 requests a second against a limit of 10: saturated, half refused.
    let mut x = 12345u64;
    let mut refused = 0;
    for _ in 0..400 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let step = Duration::from_micros((x >> 33) % 100_000);
        ce.advance(step);
        cs.advance(step);
        let e = send(&mut se, get_req("/")).await.status();
        let s = send(&mut ss, get_req("/")).await.status();
        assert_eq!(s, StatusCode::OK, "shadow mode refused a request");
        refused += u64::from(e == StatusCode::TOO_MANY_REQUESTS);
        // The limiter under shadow mode took what the enforced one took, no more, no less.
        assert_eq!(
            enforced.policy().policy().limiter().tokens(),
            shadow.policy().policy().limiter().tokens()
        );
    }
    assert!(
        (100..300).contains(&refused),
        "not saturated: {refused} refused"
    );
    assert_eq!(
        enforced.policy().counts(),
        counts(400 - refused, refused, 0)
    );
    assert_eq!(shadow.policy().counts(), counts(400 - refused, 0, refused));
}

/// A request from client `i` (the `x-client` header).
fn from_client(i: u32) -> Request<Body> {
    let mut req = get_req("/");
    req.headers_mut()
        .insert("x-client", i.to_string().parse().unwrap());
    req
}

#[tokio::test]
async fn a_fraction_enforces_a_stable_set_of_clients_that_grows_with_it() {
    const CLIENTS: u32 = 2000;
    // One permit per client, never refilled: a client's second request is refused.
    let map = KeyedTokenBucket::builder(Limit::ZERO, 1)
        .clock(ManualClock::new(START))
        .build()
        .unwrap();
    let enforcement = Enforcement::new(Mode::Fraction(0.25)).unwrap();
    let policy = per_key("per-client", key::Header("x-client".parse().unwrap()), map)
        .enforcement(enforcement.clone())
        // A fixed hasher: the same clients are enforced on every run.
        .hasher(BuildHasherDefault::<DefaultHasher>::default());
    let layer = RateLimitLayer::new(policy);
    let mut svc = service(layer.clone());
    for i in 0..CLIENTS {
        assert_eq!(
            send(&mut svc, from_client(i)).await.status(),
            StatusCode::OK
        );
    }
    let quarter = refused_clients(&layer, CLIENTS).await;
    // A binomial share of 2000 at 1/4: 500 ± 19.4 (one sigma); ±100 is over five sigmas.
    assert!(
        (400..=600).contains(&quarter.len()),
        "{} enforced",
        quarter.len()
    );
    // Stable: each client is on the same side on every request.
    assert_eq!(refused_clients(&layer, CLIENTS).await, quarter);
    // Raising the fraction only adds clients.
    enforcement.set(Mode::Fraction(0.5)).unwrap();
    let half = refused_clients(&layer, CLIENTS).await;
    assert!(
        (900..=1100).contains(&half.len()),
        "{} enforced",
        half.len()
    );
    assert!(
        quarter.iter().all(|i| half.contains(i)),
        "a client left the enforced set"
    );
    enforcement.set(Mode::Shadow).unwrap();
    assert!(refused_clients(&layer, CLIENTS).await.is_empty());
    enforcement.set(Mode::Enforce).unwrap();
    assert_eq!(
        refused_clients(&layer, CLIENTS).await.len(),
        CLIENTS as usize
    );
    let c = layer.policy().counts();
    assert_eq!(c.allowed, u64::from(CLIENTS));
    assert_eq!(
        c.refused + c.shadow_refused,
        5 * u64::from(CLIENTS),
        "every second request is refused, enforced or not"
    );
    assert_eq!(
        c.refused,
        (2 * quarter.len() + half.len()) as u64 + u64::from(CLIENTS)
    );
}

/// The clients among `0..clients` whose next request `layer` refuses.
async fn refused_clients<P: Policy<Body>>(layer: &RateLimitLayer<P>, clients: u32) -> Vec<u32> {
    let mut svc = service(layer.clone());
    let mut set = Vec::new();
    for i in 0..clients {
        if send(&mut svc, from_client(i)).await.status() == StatusCode::TOO_MANY_REQUESTS {
            set.push(i);
        }
    }
    set
}

#[tokio::test]
async fn the_mode_changes_at_run_time_under_a_built_layer() {
    let clock = ManualClock::new(START);
    let enforcement = Enforcement::shadow();
    let layer = RateLimitLayer::new(global("all", bucket(&clock)).enforcement(enforcement.clone()));
    let mut svc = service(layer);
    for _ in 0..5 {
        assert_eq!(send(&mut svc, get_req("/")).await.status(), StatusCode::OK);
    }
    // The burst is spent: shadow mode lets the next one go on, enforcement refuses it.
    assert_eq!(send(&mut svc, get_req("/")).await.status(), StatusCode::OK);
    enforcement.set(Mode::Enforce).unwrap();
    let resp = send(&mut svc, get_req("/")).await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(resp.headers()["retry-after"], "1");
    // A fraction of one client: the global policy's one client is wholly in or out.
    enforcement.set(Mode::Fraction(0.5)).unwrap();
    let first = send(&mut svc, get_req("/")).await.status();
    for _ in 0..20 {
        assert_eq!(send(&mut svc, get_req("/")).await.status(), first);
    }
}

#[test]
fn bad_fractions_are_typed_errors_and_change_nothing() {
    for f in [f64::NAN, -0.1, 1.5, f64::INFINITY, f64::NEG_INFINITY] {
        let err = Enforcement::new(Mode::Fraction(f)).unwrap_err();
        assert!(matches!(err, ConfigError::EnforcedFraction(g) if g.to_bits() == f.to_bits()));
        let e = Enforcement::shadow();
        assert!(e.set(Mode::Fraction(f)).is_err());
        assert_eq!(e.mode(), Mode::Shadow);
    }
    let e = Enforcement::enforce();
    assert_eq!(e.mode(), Mode::Enforce);
    for (set, read) in [
        (Mode::Fraction(0.0), Mode::Shadow),
        (Mode::Fraction(-0.0), Mode::Shadow),
        (Mode::Fraction(1.0), Mode::Enforce),
        (Mode::Fraction(0.5), Mode::Fraction(0.5)),
        (Mode::Fraction(0.1), Mode::Fraction(0.1)),
    ] {
        e.set(set).unwrap();
        assert_eq!(e.mode(), read);
    }
}

#[tokio::test]
async fn under_and_a_shadow_refusal_passes_and_the_other_grant_is_kept() {
    let clock = ManualClock::new(START);
    // Burst 1, no refill on a clock that stands still.
    let one = || {
        TokenBucket::builder(Limit::per_second(1.0).unwrap(), 1)
            .clock(clock.clone())
            .build()
    };
    let spent = || {
        let b = one();
        assert!(b.allow());
        b
    };

    // The second refuses in shadow: the first's grant stands (it is not refunded).
    let layer = RateLimitLayer::new(
        global("a", one()).and(global("b", spent()).enforcement(Enforcement::shadow())),
    );
    assert_eq!(once(&layer).await, StatusCode::OK);
    let both = layer.policy();
    assert_eq!(
        both.first().limiter().tokens(),
        0.0,
        "the first's grant was given back"
    );
    assert_eq!(both.second().counts(), counts(0, 0, 1));

    // The first refuses in shadow: the second is still asked, and its grant stands.
    let layer = RateLimitLayer::new(
        global("a", spent())
            .enforcement(Enforcement::shadow())
            .and(global("b", one())),
    );
    assert_eq!(once(&layer).await, StatusCode::OK);
    assert_eq!(layer.policy().second().limiter().tokens(), 0.0);

    // The first refuses in shadow, the second refuses for real: refused, and the first's
    // shadow pass gives back nothing (it took nothing).
    let layer = RateLimitLayer::new(
        global("a", spent())
            .enforcement(Enforcement::shadow())
            .and(global("b", spent())),
    );
    assert_eq!(once(&layer).await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(layer.policy().first().policy().limiter().tokens(), 0.0);

    // An enforced first grants, the second refuses: the first's grant is given back.
    let layer = RateLimitLayer::new(
        global("a", one())
            .enforcement(Enforcement::enforce())
            .and(global("b", spent())),
    );
    assert_eq!(once(&layer).await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(layer.policy().first().policy().limiter().tokens(), 1.0);
}

/// The status of one request through `layer`.
async fn once<P: Policy<Body>>(layer: &RateLimitLayer<P>) -> StatusCode {
    send(&mut service(layer.clone()), get_req("/"))
        .await
        .status()
}

#[tokio::test(start_paused = true)]
async fn delay_mode_does_not_hold_a_client_that_is_not_enforced() {
    let clock = ManualClock::new(START);
    let enforcement = Enforcement::shadow();
    let layer = RateLimitLayer::new(global("all", bucket(&clock)).enforcement(enforcement.clone()))
        .delay(Duration::from_secs(1));
    let mut svc = service(layer.clone());
    let tokens = || layer.policy().policy().limiter().tokens();
    for _ in 0..5 {
        send(&mut svc, get_req("/")).await;
    }
    // Past the burst: a reservation 100 ms ahead, answered at once (paused time does not
    // move unless a timer is awaited), the reservation kept.
    let t0 = tokio::time::Instant::now();
    assert_eq!(send(&mut svc, get_req("/")).await.status(), StatusCode::OK);
    assert_eq!(tokio::time::Instant::now(), t0, "a shadow client was held");
    assert_eq!(tokens(), -1.0);
    // Enforced, the next one waits for its permit, 200 ms ahead.
    enforcement.set(Mode::Enforce).unwrap();
    assert_eq!(send(&mut svc, get_req("/")).await.status(), StatusCode::OK);
    assert_eq!(tokio::time::Instant::now() - t0, Duration::from_millis(200));
    assert_eq!(tokens(), -2.0);
    assert_eq!(layer.policy().counts(), counts(7, 0, 0));
}

#[test]
fn counts_are_exact_across_threads() {
    const THREADS: u64 = 4;
    const EACH: u64 = 20_000;
    for mode in [Mode::Enforce, Mode::Shadow] {
        // 1000 permits, never refilled: exactly 1000 grants, whoever gets them.
        let limiter = TokenBucket::builder(Limit::ZERO, 1000)
            .clock(ManualClock::new(START))
            .build();
        let policy = Arc::new(global("all", limiter).enforcement(Enforcement::new(mode).unwrap()));
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                let p = &policy;
                s.spawn(move || {
                    for _ in 0..EACH {
                        let d = Policy::<()>::decide(p, (), Ask::default());
                        assert!(futures_ready(d).result.is_ok() || mode == Mode::Enforce);
                    }
                });
            }
        });
        let refused = THREADS * EACH - 1000;
        let want = match mode {
            Mode::Enforce => counts(1000, refused, 0),
            _ => counts(1000, 0, refused),
        };
        assert_eq!(policy.counts(), want);
    }
}

/// An in-process decision, which is ready at once.
fn futures_ready<F: std::future::Future + Unpin>(mut f: F) -> F::Output {
    let cx = &mut std::task::Context::from_waker(std::task::Waker::noop());
    match std::pin::Pin::new(&mut f).poll(cx) {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => panic!("an in-process policy decides at once"),
    }
}
