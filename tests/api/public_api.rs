//! The five-minute API: a limiter's time through `clock().now()`, `Keyed` maps of mixed
//! limiter types through `Box`/`Arc<dyn PerKeyLimiter>`, a fallible per-key factory
//! (`Keyed::try_new`), `Denied::retry_after_secs` for `Retry-After`, and the exact Debug and
//! Display strings of limits and limiters.

use std::time::Duration;

use turnstile::{Denied, Limit, ManualClock, Nanos};

const SEC: u64 = 1_000_000_000;

fn at(nanos: u64) -> Nanos {
    Nanos::new(nanos)
}

/// A clock at 42 ns, read through the limiters' `clock().now()`, the one way to read a
/// limiter's time.
mod the_time_through_the_clock {
    use std::time::Duration;

    use turnstile::{
        reference, Clock, FixedWindow, LeakyBucket, LeakyMeter, Limit, ManualClock, Nanos,
        SlidingWindow, SmoothBursty, SmoothWarmingUp, Sometimes, TokenBucket,
    };

    fn clock() -> ManualClock {
        ManualClock::new(Nanos::new(42))
    }

    #[test]
    fn every_limiter_reads_its_clock() {
        let one = Limit::per_second(1.0).unwrap();
        let sec = Duration::from_secs(1);
        let want = Nanos::new(42);
        assert_eq!(
            TokenBucket::builder(one, 1)
                .clock(clock())
                .build()
                .clock()
                .now(),
            want
        );
        assert_eq!(Sometimes::with_clock(clock()).clock().now(), want);
        let lb = LeakyBucket::builder(1).clock(clock()).build().unwrap();
        assert_eq!(lb.clock().now(), want);
        assert_eq!(
            LeakyMeter::builder(1, one)
                .clock(clock())
                .build()
                .unwrap()
                .clock()
                .now(),
            want
        );
        let sb = SmoothBursty::builder(1.0).clock(clock()).build().unwrap();
        assert_eq!(sb.clock().now(), want);
        let sw = SmoothWarmingUp::builder(1.0, sec)
            .clock(clock())
            .build()
            .unwrap();
        assert_eq!(sw.clock().now(), want);
        let fw = FixedWindow::builder(1, sec).clock(clock()).build().unwrap();
        assert_eq!(fw.clock().now(), want);
        let fw = FixedWindow::builder(1, sec)
            .clock(clock())
            .build_compact()
            .unwrap();
        assert_eq!(fw.clock().now(), want);
        let sl = SlidingWindow::builder(1, sec)
            .clock(clock())
            .build()
            .unwrap();
        assert_eq!(sl.clock().now(), want);
        assert_eq!(
            TokenBucket::builder(one, 1)
                .clock(clock())
                .build()
                .clock()
                .now(),
            want
        );

        // The twins.
        assert_eq!(
            reference::TokenBucket::from(turnstile::TokenBucket::builder(one, 1).clock(clock()))
                .clock()
                .now(),
            want
        );
        let lb =
            reference::LeakyBucket::try_from(turnstile::LeakyBucket::builder(1).clock(clock()))
                .unwrap();
        assert_eq!(lb.clock().now(), want);
        let sb =
            reference::SmoothBursty::try_from(turnstile::SmoothBursty::builder(1.0).clock(clock()))
                .unwrap();
        assert_eq!(sb.clock().now(), want);
        let sw = reference::SmoothWarmingUp::try_from(
            turnstile::SmoothWarmingUp::builder(1.0, sec).clock(clock()),
        )
        .unwrap();
        assert_eq!(sw.clock().now(), want);
        let fw = reference::FixedWindow::try_from(
            turnstile::FixedWindow::builder(1, sec).clock(clock()),
        )
        .unwrap();
        assert_eq!(fw.clock().now(), want);
        let sl = reference::SlidingWindow::try_from(
            turnstile::SlidingWindow::builder(1, sec).clock(clock()),
        )
        .unwrap();
        assert_eq!(sl.clock().now(), want);
    }

    #[cfg(feature = "keyed")]
    #[test]
    fn keyed_maps_read_their_clock() {
        use turnstile::{Keyed, KeyedTokenBucket};
        let k = Keyed::builder(|_: &u8| FixedWindow::new(1, Duration::from_secs(1)).unwrap())
            .clock(clock())
            .build()
            .unwrap();
        assert_eq!(k.clock().now(), Nanos::new(42));
        let k = KeyedTokenBucket::<u8>::builder(Limit::per_second(1.0).unwrap(), 1)
            .clock(clock())
            .build()
            .unwrap();
        assert_eq!(k.clock().now(), Nanos::new(42));
    }

    /// The `Limiter` trait's `now()`, which generic code reads, is the same clock's.
    #[test]
    fn the_limiter_trait_reads_the_same_clock() {
        use turnstile::Limiter;
        let tb = TokenBucket::builder(Limit::per_second(1.0).unwrap(), 1)
            .clock(clock())
            .build();
        assert_eq!(tb.clock().now(), Nanos::new(42));
        assert_eq!(Limiter::now(&tb), tb.clock().now());
    }
}

// ---- Keyed with mixed limiter types --------------------------------------------------------

#[cfg(feature = "keyed")]
mod mixed {
    use std::sync::Arc;
    use std::time::Duration;

    use turnstile::{
        FixedWindow, Keyed, Limit, Limiter, ManualClock, Nanos, PerKeyLimiter, TokenBucket,
    };

    use super::{at, SEC};

    /// Even keys get a token bucket (2/s, burst 2), odd keys a fixed window (1 per 10 s).
    fn mixed(clock: &ManualClock) -> Keyed<u32, Box<dyn PerKeyLimiter>, ManualClock> {
        let c = clock.clone();
        Keyed::builder(move |k: &u32| -> Box<dyn PerKeyLimiter> {
            if k.is_multiple_of(2) {
                Box::new(
                    TokenBucket::builder(Limit::per_second(2.0).unwrap(), 2)
                        .clock(c.clone())
                        .build(),
                )
            } else {
                Box::new(
                    FixedWindow::builder(1, Duration::from_secs(10))
                        .clock(c.clone())
                        .build()
                        .unwrap(),
                )
            }
        })
        .clock(clock.clone())
        .sweep_every(Duration::MAX)
        .build()
        .unwrap()
    }

    #[test]
    fn box_dyn_mixes_two_limiter_types_by_key() {
        let clock = ManualClock::default();
        let k = mixed(&clock);
        // The bucket: burst 2, then a retry in half a second.
        assert!(k.check(&0).is_ok());
        assert!(k.check(&0).is_ok());
        let d = k.check(&0).unwrap_err();
        assert_eq!(d.retry_after(), Some(Duration::from_millis(500)));
        // The window: 1, then a retry when the 10 s window ends.
        assert!(k.check(&1).is_ok());
        let d = k.check(&1).unwrap_err();
        assert_eq!(d.retry_after(), Some(Duration::from_secs(10)));
        assert_eq!(k.len(), 2);
        // The limiter's own API through the trait object: `with`.
        assert_eq!(k.with(&1, |l| l.check().is_ok()), Some(false));

        // Both are idle through the box (the bucket refills in 1 s, the window ends at 10 s).
        clock.set(at(5 * SEC));
        assert_eq!(k.evict_idle(), 1);
        assert!(!k.contains(&0) && k.contains(&1));
        clock.set(at(10 * SEC));
        assert_eq!(k.evict_idle(), 1);
        assert!(k.is_empty());
    }

    /// `Idle::born_at` reaches the boxed limiter: after an eviction judged at 5 s, a stale
    /// reading at 4.5 s finds the key's new bucket dated at 5 s (1 token short), not full.
    #[test]
    fn box_forwards_born_at() {
        let clock = ManualClock::default();
        let k = mixed(&clock);
        assert!(k.check_n_at(&0, at(4 * SEC), 2).is_ok());
        clock.set(at(5 * SEC));
        assert_eq!(k.evict_idle(), 1);
        // Full at 5 s, 1 token at 4.5 s: 2 tokens at the stale reading are refused.
        let d = k.check_n_at(&0, at(4 * SEC + SEC / 2), 2).unwrap_err();
        assert_eq!(d.retry_at(), Some(at(5 * SEC)));
    }

    /// `Arc<dyn PerKeyLimiter>`: a factory can hand keys fresh limiters or one shared group
    /// limiter; the group's state survives the eviction of a key that holds it.
    #[test]
    fn arc_dyn_with_a_shared_group_limiter() {
        let clock = ManualClock::default();
        let group: Arc<dyn PerKeyLimiter> = Arc::new(
            TokenBucket::builder(Limit::per_second(1.0).unwrap(), 2)
                .clock(clock.clone())
                .build(),
        );
        let c = clock.clone();
        let g = group.clone();
        let k: Keyed<&'static str, Arc<dyn PerKeyLimiter>, ManualClock> =
            Keyed::builder(move |name: &&'static str| -> Arc<dyn PerKeyLimiter> {
                if name.starts_with("team:") {
                    g.clone()
                } else {
                    Arc::new(
                        TokenBucket::builder(Limit::per_second(1.0).unwrap(), 1)
                            .clock(c.clone())
                            .build(),
                    )
                }
            })
            .clock(clock.clone())
            .sweep_every(Duration::MAX)
            .build()
            .unwrap();
        assert!(k.check(&"team:a").is_ok());
        assert!(k.check(&"team:b").is_ok());
        assert!(k.check(&"team:a").is_err()); // the group's 2 are spent, by a and b
        assert!(k.check(&"solo").is_ok());
        assert!(k.check(&"solo").is_err());
        assert!(group.check_n_at(Nanos::ZERO, 1).is_err());

        // Refilled at 2 s: idle, so both team keys go; the group limiter itself stays.
        clock.set(at(2 * SEC));
        assert_eq!(k.evict_idle(), 3);
        assert!(k.check(&"team:a").is_ok());
        assert!(k.check(&"team:b").is_ok());
        assert!(group.check().is_err()); // one limiter: the keys' grants counted there
    }
}

// ---- fallible factory ----------------------------------------------------------------------

#[cfg(feature = "keyed")]
mod fallible {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use turnstile::{ConfigError, FixedWindow, Keyed, ManualClock};

    use super::{at, SEC};

    /// The key is the quota; 0 is a configuration error. Counts factory calls.
    fn by_quota(
        calls: &Arc<AtomicU32>,
        max_keys: u64,
    ) -> Keyed<u32, FixedWindow<ManualClock>, ManualClock, ConfigError> {
        let calls = calls.clone();
        let clock = ManualClock::default();
        let c = clock.clone();
        Keyed::try_builder(move |q: &u32| {
            calls.fetch_add(1, Ordering::Relaxed);
            FixedWindow::builder(*q, Duration::from_secs(1))
                .clock(c.clone())
                .build()
        })
        .max_keys(max_keys)
        .clock(clock)
        .sweep_every(Duration::MAX)
        .build()
        .unwrap()
    }

    #[test]
    fn a_failing_factory_is_an_error_not_a_panic() {
        let calls = Arc::new(AtomicU32::new(0));
        let k = by_quota(&calls, u64::MAX);
        assert_eq!(k.try_check(&0), Err(ConfigError::ZeroQuota));
        assert_eq!(k.try_check_n(&0, 3), Err(ConfigError::ZeroQuota));
        assert_eq!(
            k.try_check_n_at(&0, at(SEC), 1),
            Err(ConfigError::ZeroQuota)
        );
        assert_eq!(
            k.try_with(&0, |w| w.status().remaining),
            Err(ConfigError::ZeroQuota)
        );
        assert!(!k.contains(&0));
        assert_eq!(k.len(), 0);
        // Not cached: every check of the bad key asks the factory again.
        assert_eq!(calls.load(Ordering::Relaxed), 4);

        // Good keys work as in an infallible map: grants, then denials with retry times.
        assert_eq!(k.try_check_n(&2, 2), Ok(Ok(())));
        let denied = k.try_check(&2).unwrap().unwrap_err();
        assert_eq!(denied.retry_after_secs(), Some(1));
        assert_eq!(k.try_with(&2, |w| w.status().remaining), Ok(Some(0)));
        assert_eq!(k.len(), 1);
        assert_eq!(calls.load(Ordering::Relaxed), 5); // built once
    }

    /// A failed key takes no room under `max_keys`: with room for one key, failures first
    /// still leave it for a good key.
    #[test]
    fn a_failed_key_holds_no_room() {
        let calls = Arc::new(AtomicU32::new(0));
        let k = by_quota(&calls, 1);
        for _ in 0..3 {
            assert_eq!(k.try_check(&0), Err(ConfigError::ZeroQuota));
        }
        assert_eq!(k.try_check(&5), Ok(Ok(())));
        assert_eq!(k.len(), 1);
        // Now full (and key 5 busy): a new key is refused by the full-map policy, without
        // its factory running, good or bad.
        let before = calls.load(Ordering::Relaxed);
        assert!(matches!(k.try_check(&7), Ok(Err(_))));
        assert!(matches!(k.try_check(&0), Ok(Err(_))));
        assert_eq!(calls.load(Ordering::Relaxed), before);
    }

    #[test]
    fn try_new_with_a_string_error() {
        let k = Keyed::try_new(|tier: &String| match tier.as_str() {
            "free" => Ok(FixedWindow::new(1, Duration::from_secs(60)).unwrap()),
            other => Err(format!("no tier {other}")),
        });
        assert_eq!(k.try_check("free"), Ok(Ok(())));
        assert!(k.try_check("free").unwrap().is_err());
        assert_eq!(k.try_check("gold"), Err("no tier gold".to_string()));
        assert_eq!(k.len(), 1);
    }
}

// ---- Retry-After ---------------------------------------------------------------------------

#[test]
fn retry_after_secs_rounds_up_to_whole_seconds() {
    let t0 = at(7 * SEC + 123);
    let secs = |wait: u64| Denied::new(t0, Some(at(t0.as_u64() + wait))).retry_after_secs();
    assert_eq!(secs(0), Some(0)); // retry at once
    assert_eq!(secs(1), Some(1)); // 1 ns: the next whole second
    assert_eq!(secs(SEC / 2), Some(1));
    assert_eq!(secs(SEC - 1), Some(1));
    assert_eq!(secs(SEC), Some(1));
    assert_eq!(secs(SEC + 1), Some(2));
    assert_eq!(secs(2 * SEC), Some(2)); // exactly 2 s: 2
    assert_eq!(secs(2 * SEC + 1), Some(3));
    assert_eq!(secs(3600 * SEC - 1), Some(3600));
    // Never: no header value.
    assert_eq!(Denied::new(t0, None).retry_after_secs(), None);
    // A retry time before the check (clamped, as `retry_after`): now.
    assert_eq!(Denied::new(t0, Some(at(5))).retry_after_secs(), Some(0));
    // The far end does not overflow.
    let far = Denied::new(Nanos::ZERO, Some(Nanos::MAX)).retry_after_secs();
    assert_eq!(far, Some(u64::MAX / SEC + 1));
}

#[test]
fn retry_after_secs_of_a_real_denial() {
    use turnstile::{Limiter, TokenBucket};
    // 1 token every 1.5 s: a retry in 1.5 s is a Retry-After of 2.
    let tb = TokenBucket::builder(Limit::every(Duration::from_millis(1500)), 1)
        .clock(ManualClock::default())
        .build();
    assert!(tb.check_n_at(Nanos::ZERO, 1).is_ok());
    let d = tb.check_n_at(Nanos::ZERO, 1).unwrap_err();
    assert_eq!(d.retry_after(), Some(Duration::from_millis(1500)));
    assert_eq!(d.retry_after_secs(), Some(2));
}

// ---- Debug and Display ---------------------------------------------------------------------

#[test]
fn limit_display_and_debug_are_compact() {
    let cases = [
        (Limit::per_second(10.0).unwrap(), "10/s"),
        (Limit::every(Duration::from_secs(2)), "0.5/s"),
        (Limit::per_second(1e300).unwrap(), "1e300/s"),
        (Limit::per_second(1e16).unwrap(), "1e16/s"),
        (Limit::per_second(1234.5).unwrap(), "1234.5/s"),
        (Limit::per_second(2.5e-7).unwrap(), "2.5e-7/s"),
        (Limit::per_second(1e-300).unwrap(), "1e-300/s"),
        (Limit::ZERO, "0/s"),
        (Limit::INF, "inf"),
        (Limit::per_second(f64::INFINITY).unwrap(), "inf"),
    ];
    for (limit, want) in cases {
        assert_eq!(limit.to_string(), want);
        assert_eq!(format!("{limit:?}"), want);
    }
}

#[test]
fn token_bucket_debug() {
    use turnstile::{reference, TokenBucket};
    let clock = ManualClock::default();
    let limit = Limit::per_second(4.0).unwrap();
    let tb = TokenBucket::builder(limit, 2).clock(clock.clone()).build();
    let twin = reference::TokenBucket::from(
        turnstile::TokenBucket::builder(limit, 2).clock(clock.clone()),
    );
    assert!(tb.allow_n_at(Nanos::ZERO, 2) && twin.allow_n_at(Nanos::ZERO, 2));
    clock.set(at(SEC / 8));
    assert_eq!(
        format!("{tb:?}"),
        "TokenBucket { limit: 4/s, burst: 2, tokens: 0.5 }"
    );
    assert_eq!(
        format!("{twin:?}"),
        "reference::TokenBucket { limit: 4/s, burst: 2, tokens: 0.5 }"
    );
}

#[test]
fn window_debug() {
    use turnstile::{reference, FixedWindow, SlidingWindow};
    let clock = ManualClock::default();
    let sec = Duration::from_secs(1);
    let fw = FixedWindow::builder(5, sec)
        .clock(clock.clone())
        .build()
        .unwrap();
    let fw_twin = reference::FixedWindow::try_from(
        turnstile::FixedWindow::builder(5, sec).clock(clock.clone()),
    )
    .unwrap();
    assert!(fw.take_n_at(Nanos::ZERO, 2).is_permitted());
    assert!(fw_twin.take_n_at(Nanos::ZERO, 2).is_permitted());
    let want = "FixedWindow { quota: 5, period: 1s, utc_offset_secs: None, remaining: 3, \
                resets_at: 1000000000ns }";
    assert_eq!(format!("{fw:?}"), want);
    assert_eq!(format!("{fw_twin:?}"), format!("reference::{want}"));

    let sw = SlidingWindow::builder(5, sec)
        .clock(clock.clone())
        .build()
        .unwrap();
    let sw_twin = reference::SlidingWindow::try_from(
        turnstile::SlidingWindow::builder(5, sec).clock(clock.clone()),
    )
    .unwrap();
    assert!(sw.allow_n_at(Nanos::ZERO, 3) && sw_twin.allow_n_at(Nanos::ZERO, 3));
    clock.set(at(SEC + SEC / 2));
    // At 1.5 s the 3 of window 0 weigh 1.5: 3 more fit, and the weight is gone at 2 s.
    let want = "SlidingWindow { quota: 5, period: 1s, previous: 3, current: 0, remaining: 3, \
                resets_at: 2000000000ns }";
    assert_eq!(format!("{sw:?}"), want);
    assert_eq!(format!("{sw_twin:?}"), format!("reference::{want}"));
}

#[test]
fn smooth_debug() {
    use turnstile::{reference, SmoothBursty};
    let clock = ManualClock::default();
    let sb = SmoothBursty::builder(2.0)
        .clock(clock.clone())
        .build()
        .unwrap();
    let twin = reference::SmoothBursty::try_from(
        turnstile::SmoothBursty::builder(2.0).clock(clock.clone()),
    )
    .unwrap();
    // 1 permit, paid later: the next is free at 0.5 s. At 2 s, 1.5 s of idleness stored 2
    // permits (the 1-second burst's maximum).
    assert_eq!(sb.reserve_n_at(Nanos::ZERO, 1).unwrap(), Duration::ZERO);
    assert_eq!(twin.reserve_n_at(Nanos::ZERO, 1).unwrap(), Duration::ZERO);
    let want = "SmoothBursty { rate: 2/s, max_permits: 2.0, stored_permits: 0.0, \
                next_free: 500000000ns }";
    assert_eq!(format!("{sb:?}"), want);
    assert_eq!(format!("{twin:?}"), format!("reference::{want}"));
    clock.set(at(2 * SEC));
    let want = "SmoothBursty { rate: 2/s, max_permits: 2.0, stored_permits: 2.0, \
                next_free: 500000000ns }";
    assert_eq!(format!("{sb:?}"), want);
    assert_eq!(format!("{twin:?}"), format!("reference::{want}"));
}

#[test]
fn leaky_debug() {
    use turnstile::{reference, LeakyBucket, LeakyMeter};
    let clock = ManualClock::default();
    let lb = LeakyBucket::builder(10)
        .slack(2)
        .clock(clock.clone())
        .build()
        .unwrap();
    let twin = reference::LeakyBucket::try_from(
        turnstile::LeakyBucket::builder(10)
            .slack(2)
            .clock(clock.clone()),
    )
    .unwrap();
    let want = "LeakyBucket { rate: 10, per: 1s, slack: 2, per_request: 100ms, next: None }";
    assert_eq!(format!("{lb:?}"), want);
    assert_eq!(format!("{twin:?}"), format!("reference::{want}"));
    lb.take_at(at(7));
    twin.take_at(at(7));
    let want = "LeakyBucket { rate: 10, per: 1s, slack: 2, per_request: 100ms, next: Some(7ns) }";
    assert_eq!(format!("{lb:?}"), want);
    assert_eq!(format!("{twin:?}"), format!("reference::{want}"));
    assert_eq!(
        format!("{:?}", reference::LeakyBucket::unlimited()),
        "reference::LeakyBucket(unlimited)"
    );

    let meter = LeakyMeter::builder(3, Limit::per_second(2.0).unwrap())
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(meter.allow_n_at(at(SEC), 3));
    clock.set(at(SEC + SEC / 4));
    assert_eq!(
        format!("{meter:?}"),
        "LeakyMeter { capacity: 3, leak: 2/s, level: 2.5 }"
    );
}

#[cfg(feature = "keyed")]
#[test]
fn keyed_debug() {
    use turnstile::keyed::WhenFull;
    use turnstile::{FixedWindow, Keyed, KeyedTokenBucket};
    let k = Keyed::new(|_: &u8| FixedWindow::new(1, Duration::from_secs(1)).unwrap());
    assert!(k.check(&1).is_ok());
    assert_eq!(
        format!("{k:?}"),
        "Keyed { len: 1, max_keys: Some(1048576), when_full: Deny, sweep_every: 10s }"
    );
    let k = Keyed::builder(|_: &u8| FixedWindow::new(1, Duration::from_secs(1)).unwrap())
        .max_keys(100)
        .when_full(WhenFull::Allow);
    assert_eq!(
        format!("{k:?}"),
        "KeyedBuilder { max_keys: Some(100), when_full: Allow, sweep_every: 10s }"
    );
    let k = KeyedTokenBucket::<u8>::builder(Limit::per_second(10.0).unwrap(), 5)
        .build()
        .unwrap();
    assert_eq!(
        format!("{k:?}"),
        "KeyedTokenBucket { len: 0, quotas: [(10/s, 5)], max_keys: Some(1048576), \
         when_full: Deny, sweep_every: 10s }"
    );
}
