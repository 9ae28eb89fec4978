//! Bad input to the smooth limiters gets a typed error, never a panic, a NaN or an overflow
//! (the test profile keeps overflow checks on). Every method is swept over extreme rates,
//! permits, timeouts and times near `u64::MAX` on the lock-free limiters, which must also never
//! report a NaN (deviation D9), and on their twins, which must not panic (they keep Guava's
//! NaN where upstream has it).

use std::time::Duration;

use turnstile::{
    reference, ConfigError, Limiter, ManualClock, Nanos, SmoothBursty, SmoothWarmingUp, WaitError,
};

const BAD_RATES: [f64; 5] = [0.0, -0.0, -1.0, f64::NAN, f64::NEG_INFINITY];

fn is_rate_error(e: &ConfigError, rate: f64) -> bool {
    matches!(e, ConfigError::RateNotPositive(r) if r.to_bits() == rate.to_bits())
}

#[test]
fn invalid_rates_are_typed_errors_that_name_the_value() {
    let w = Duration::from_secs(1);
    for rate in BAD_RATES {
        let errors = [
            SmoothBursty::new(rate).unwrap_err(),
            SmoothWarmingUp::new(rate, w).unwrap_err(),
            reference::SmoothBursty::new(rate).unwrap_err(),
            reference::SmoothWarmingUp::new(rate, w).unwrap_err(),
        ];
        for e in errors {
            assert!(is_rate_error(&e, rate), "{rate}: {e:?}");
            assert!(e.to_string().contains(&rate.to_string()), "{e}");
        }
        let l = SmoothBursty::builder(2.0)
            .clock(ManualClock::default())
            .build()
            .unwrap();
        assert!(is_rate_error(
            &l.set_rate_at(Nanos::ZERO, rate).unwrap_err(),
            rate
        ));
        assert!(is_rate_error(&l.set_rate(rate).unwrap_err(), rate));
        assert_eq!(l.rate(), 2.0, "unchanged");
        let t = reference::SmoothWarmingUp::try_from(
            turnstile::SmoothWarmingUp::builder(2.0, w).clock(ManualClock::default()),
        )
        .unwrap();
        assert!(is_rate_error(
            &t.set_rate_at(Nanos::ZERO, rate).unwrap_err(),
            rate
        ));
        assert_eq!(t.rate(), 2.0);
    }
    // The valid edges: +inf (no waits) and the smallest normal rate.
    for rate in [f64::INFINITY, f64::MAX, f64::MIN_POSITIVE] {
        assert!(SmoothBursty::new(rate).is_ok(), "{rate}");
        assert!(SmoothWarmingUp::new(rate, w).is_ok(), "{rate}");
    }
}

/// D4, as `Limit`: a subnormal rate's interval is not a finite number; every constructor and
/// `set_rate` of both implementations says so.
#[test]
fn subnormal_rates_are_rejected_like_limits() {
    let w = Duration::from_secs(1);
    for rate in [4.9e-324, f64::MIN_POSITIVE / 2.0] {
        let l = SmoothBursty::builder(2.0)
            .clock(ManualClock::default())
            .build()
            .unwrap();
        let t = reference::SmoothWarmingUp::try_from(
            turnstile::SmoothWarmingUp::builder(2.0, w).clock(ManualClock::default()),
        )
        .unwrap();
        let errors = [
            SmoothBursty::new(rate).unwrap_err(),
            SmoothWarmingUp::new(rate, w).unwrap_err(),
            reference::SmoothBursty::new(rate).unwrap_err(),
            reference::SmoothWarmingUp::new(rate, w).unwrap_err(),
            l.set_rate_at(Nanos::ZERO, rate).unwrap_err(),
            t.set_rate_at(Nanos::ZERO, rate).unwrap_err(),
        ];
        for e in errors {
            assert_eq!(e, ConfigError::SubnormalLimit(rate));
        }
        assert_eq!((l.rate(), t.rate()), (2.0, 2.0));
    }
}

/// D4: a wait that would end past the end of representable time fails with `Never` and
/// reserves nothing, instead of sleeping ~584 years.
#[test]
fn a_wait_past_the_end_of_time_is_never() {
    let w = Duration::from_secs(1);
    let bursty = SmoothBursty::builder(1e-12)
        .clock(ManualClock::default())
        .build()
        .unwrap();
    let warming = SmoothWarmingUp::builder(1e-12, w)
        .clock(ManualClock::default())
        .build()
        .unwrap();
    let never = WaitError::Never { n: 1, limit: 1e-12 };
    // The first request is free (pay later); it charges the next ~3e4 years.
    assert_eq!(bursty.reserve_n_at(Nanos::ZERO, 1), Ok(Duration::ZERO));
    assert!(warming.reserve_n_at(Nanos::ZERO, 1).is_ok());
    let t = Nanos::new(1_000_000_000);
    assert_eq!(bursty.reserve_n_at(t, 1), Err(never));
    assert_eq!(warming.reserve_n_at(t, 1), Err(never));
    assert_eq!(bursty.try_acquire_at(t, 1, Duration::MAX), Err(never));
    assert_eq!(warming.try_acquire_at(t, 1, Duration::ZERO), Err(never));
    assert_eq!(bursty.check_n_at(t, 1).unwrap_err().retry_at(), None);
    assert_eq!(warming.check_n_at(t, 1).unwrap_err().retry_at(), None);
    assert_eq!(
        bursty.reserve_n_at(t, 1),
        Err(never),
        "nothing was reserved"
    );

    // A debt that ends within representable time is still waited for: 1 permit per ~292
    // years charges ~292 years.
    let rate = 1e9 / (u64::MAX / 2) as f64;
    let l = SmoothBursty::builder(rate)
        .clock(ManualClock::default())
        .build()
        .unwrap();
    assert_eq!(l.reserve_n_at(Nanos::ZERO, 1), Ok(Duration::ZERO));
    let wait = l.reserve_n_at(Nanos::ZERO, 1).unwrap();
    assert!(wait.as_secs() > 290 * 365 * 86_400, "{wait:?}");
}

#[test]
fn invalid_warm_up_and_cold_factor_are_typed_errors() {
    // D9: a zero warm-up would make Guava's stored permits NaN (guava#2730).
    assert_eq!(
        SmoothWarmingUp::new(1.0, Duration::ZERO).unwrap_err(),
        ConfigError::ZeroWarmup(Duration::ZERO)
    );
    assert_eq!(
        reference::SmoothWarmingUp::new(1.0, Duration::ZERO).unwrap_err(),
        ConfigError::ZeroWarmup(Duration::ZERO)
    );
    for cf in [0.5, 0.0, -1.0, f64::NAN, f64::INFINITY, 0.999_999] {
        let e = SmoothWarmingUp::builder(1.0, Duration::from_secs(1))
            .cold_factor(cf)
            .build()
            .unwrap_err();
        assert!(
            matches!(e, ConfigError::InvalidColdFactor(x) if x.to_bits() == cf.to_bits()),
            "{cf}: {e:?}"
        );
        assert!(e.to_string().contains(&cf.to_string()), "{e}");
        assert!(reference::SmoothWarmingUp::try_from(
            turnstile::SmoothWarmingUp::builder(1.0, Duration::from_secs(1)).cold_factor(cf)
        )
        .is_err());
    }
    // The rate is checked first, as Guava's setRate runs before anything uses the warm-up.
    assert!(is_rate_error(
        &SmoothWarmingUp::builder(f64::NAN, Duration::ZERO)
            .cold_factor(0.0)
            .build()
            .unwrap_err(),
        f64::NAN
    ));
}

#[test]
fn a_sub_microsecond_warm_up_still_limits() {
    // guava#6475: Guava truncates a 500 ns warm-up to 0 µs, stores NaN and stops limiting; at
    // nanosecond resolution (D8) the limiter behaves: 1000 permits/s, warm in 500 ns.
    let l = SmoothWarmingUp::builder(1000.0, Duration::from_nanos(500))
        .clock(ManualClock::default())
        .build()
        .unwrap();
    let p = l.params();
    assert!(p.max_permits > 0.0 && p.max_permits < 1e-3, "{p:?}");
    let t = Nanos::new(1_000_000_000);
    assert_eq!(l.reserve_n_at(t, 1), Ok(Duration::ZERO));
    let w = l.reserve_n_at(t, 1).unwrap();
    assert!(
        w >= Duration::from_micros(999) && w <= Duration::from_micros(1001),
        "{w:?}"
    );
    for f in [p.threshold_permits, p.slope_ns, p.cool_down_interval_ns] {
        assert!(!f.is_nan());
    }
    // The twin keeps upstream's behaviour: NaN stored, no limiting.
    let twin = reference::SmoothWarmingUp::try_from(
        turnstile::SmoothWarmingUp::builder(1000.0, Duration::from_nanos(500))
            .clock(ManualClock::default()),
    )
    .unwrap();
    assert!(twin.stored_permits_at(t).is_nan());
    assert_eq!(twin.reserve_n_at(t, 1), Ok(Duration::ZERO));
    assert_eq!(twin.reserve_n_at(t, 1), Ok(Duration::ZERO));
}

#[test]
fn invalid_burst_seconds_and_stored_permits_are_typed_errors() {
    for b in [-1.0, -0.5, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let e = SmoothBursty::builder(1.0)
            .max_burst_seconds(b)
            .build()
            .unwrap_err();
        assert!(
            matches!(e, ConfigError::InvalidBurstSeconds(x) if x.to_bits() == b.to_bits()),
            "{b}: {e:?}"
        );
        assert!(e.to_string().contains(&b.to_string()), "{e}");
        assert!(reference::SmoothBursty::try_from(
            turnstile::SmoothBursty::builder(1.0).max_burst_seconds(b)
        )
        .is_err());
    }
    for p in [-1.0, f64::NAN, f64::NEG_INFINITY] {
        let e = SmoothBursty::builder(1.0)
            .initial_stored_permits(p)
            .build()
            .unwrap_err();
        assert!(
            matches!(e, ConfigError::InvalidStoredPermits(x) if x.to_bits() == p.to_bits()),
            "{p}: {e:?}"
        );
        assert!(e.to_string().contains(&p.to_string()), "{e}");
    }
    // Zero burst seconds and an infinite initial store are fine (no burst; capped).
    assert!(SmoothBursty::builder(1.0)
        .max_burst_seconds(0.0)
        .build()
        .is_ok());
    assert!(SmoothBursty::builder(1.0)
        .initial_stored_permits(f64::INFINITY)
        .build()
        .is_ok());
}

#[test]
fn zero_permits_is_a_typed_error_and_reserves_nothing() {
    let l = SmoothWarmingUp::builder(1.0, Duration::from_secs(1))
        .clock(ManualClock::default())
        .build()
        .unwrap();
    let t = reference::SmoothBursty::try_from(
        turnstile::SmoothBursty::builder(1.0).clock(ManualClock::default()),
    )
    .unwrap();
    let z = Err(WaitError::ZeroPermits);
    assert_eq!(l.reserve_n_at(Nanos::ZERO, 0), z);
    assert_eq!(l.reserve_n(0), z);
    assert_eq!(l.acquire(0), z);
    assert_eq!(l.try_acquire(0, Duration::MAX), Err(WaitError::ZeroPermits));
    assert_eq!(
        l.try_acquire_at(Nanos::ZERO, 0, Duration::ZERO),
        Err(WaitError::ZeroPermits)
    );
    assert_eq!(t.reserve_n_at(Nanos::ZERO, 0), z);
    assert_eq!(t.acquire(0), z);
    assert_eq!(
        t.try_acquire_at(Nanos::ZERO, 0, Duration::MAX),
        Err(WaitError::ZeroPermits)
    );
    assert_eq!(
        WaitError::ZeroPermits.to_string(),
        "requested permits (0) must be positive"
    );
    // Nothing was reserved: the limiters are as new.
    assert_eq!(l.stored_permits_at(Nanos::ZERO), l.params().max_permits);
    assert_eq!(l.reserve_n_at(Nanos::ZERO, 1), Ok(Duration::ZERO));
    assert_eq!(t.reserve_n_at(Nanos::ZERO, 1), Ok(Duration::ZERO));
}

fn rates() -> Vec<f64> {
    vec![
        f64::MIN_POSITIVE,
        1e-300,
        1e-4,
        1e-3,
        1.0,
        1e9,
        1e18,
        1e300,
        f64::MAX,
        f64::INFINITY,
    ]
}

const TIMES: [u64; 6] = [0, 1, 1 << 40, u64::MAX / 2, u64::MAX - 1, u64::MAX];
const NS: [u32; 4] = [0, 1, u32::MAX - 1, u32::MAX];
const TIMEOUTS: [Duration; 3] = [Duration::ZERO, Duration::from_secs(1), Duration::MAX];

/// Every method at every extreme on one limiter; `strict` also forbids NaN anywhere.
macro_rules! sweep {
    ($l:expr, $strict:expr) => {{
        let l = $l;
        let rs = rates();
        for (i, t) in TIMES.map(Nanos::new).into_iter().enumerate() {
            for n in NS {
                let _ = l.reserve_n_at(t, n);
                for to in TIMEOUTS {
                    let _ = l.try_acquire_at(t, n, to);
                }
                let _ = l.check_n_at(t, n);
                let stored = l.stored_permits_at(t);
                if $strict {
                    assert!(!stored.is_nan(), "{t:?} {n}: {l:?}");
                }
            }
            l.set_rate_at(t, rs[i % rs.len()]).unwrap();
            if $strict {
                let p = l.params();
                for f in [
                    p.rate,
                    p.stable_interval_ns,
                    p.cold_interval_ns,
                    p.max_permits,
                    p.threshold_permits,
                    p.slope_ns,
                    p.cool_down_interval_ns,
                ] {
                    assert!(!f.is_nan(), "{p:?}");
                }
                assert!(!l.stored_permits_at(t).is_nan(), "{l:?}");
            }
        }
        // The clock reads Nanos::MAX and the lock-free next_free cannot pass it, so nothing
        // sleeps. (The twin's microsecond `long` can run ~1000 times further: its blocking
        // forms would sleep for millennia, so they are not called on it.)
        if $strict {
            assert!(l.try_acquire(1, Duration::MAX).unwrap());
            assert_eq!(l.acquire(u32::MAX), Ok(Duration::ZERO));
        }
        let _ = l.reserve_n(u32::MAX);
        let _ = l.check();
        let _ = format!("{l:?}");
    }};
}

#[test]
fn lock_free_limiters_survive_every_extreme() {
    for rate in rates() {
        for burst in [0.0, 1.0, 1e300] {
            for initial in [0.0, 1.0, f64::INFINITY] {
                let l = SmoothBursty::builder(rate)
                    .max_burst_seconds(burst)
                    .initial_stored_permits(initial)
                    .clock(ManualClock::new(Nanos::MAX))
                    .build()
                    .unwrap();
                sweep!(&l, true);
            }
        }
        for warmup in [
            Duration::from_nanos(1),
            Duration::from_secs(1),
            Duration::MAX,
        ] {
            for cf in [1.0, 3.0, 1e300] {
                let l = SmoothWarmingUp::builder(rate, warmup)
                    .cold_factor(cf)
                    .clock(ManualClock::new(Nanos::MAX))
                    .build()
                    .unwrap();
                sweep!(&l, true);
            }
        }
    }
}

#[test]
fn mutex_twins_survive_every_extreme() {
    for rate in rates() {
        for burst in [0.0, 1.0, 1e300] {
            let l = reference::SmoothBursty::try_from(
                turnstile::SmoothBursty::builder(rate)
                    .max_burst_seconds(burst)
                    .clock(ManualClock::new(Nanos::MAX)),
            )
            .unwrap();
            sweep!(&l, false);
        }
        for warmup in [
            Duration::from_nanos(1),
            Duration::from_secs(1),
            Duration::MAX,
        ] {
            for cf in [1.0, 3.0, 1e300] {
                let l = reference::SmoothWarmingUp::try_from(
                    turnstile::SmoothWarmingUp::builder(rate, warmup)
                        .cold_factor(cf)
                        .clock(ManualClock::new(Nanos::MAX)),
                )
                .unwrap();
                sweep!(&l, false);
            }
        }
    }
}

#[test]
fn waits_at_the_end_of_time_saturate() {
    // A debt that would pass the end of time stops there (Guava's saturatedAdd), and a wait
    // for a saturated debt is never satisfied (D4): nothing sleeps until the end of time.
    let l = SmoothBursty::builder(1e-3)
        .clock(ManualClock::default())
        .build()
        .unwrap();
    let t = Nanos::new(u64::MAX - 5);
    assert_eq!(l.reserve_n_at(t, u32::MAX), Ok(Duration::ZERO));
    let never = WaitError::Never { n: 1, limit: 1e-3 };
    assert_eq!(l.reserve_n_at(t, 1), Err(never));
    assert_eq!(l.reserve_n_at(Nanos::ZERO, 1), Err(never));
    let d = l.check_n_at(Nanos::ZERO, 1).unwrap_err();
    assert_eq!(d.retry_at(), None);
    assert_eq!(l.try_acquire_at(Nanos::ZERO, 1, Duration::MAX), Err(never));
    assert_eq!(
        l.try_acquire_at(Nanos::ZERO, 1, Duration::from_secs(1)),
        Err(never)
    );
    // At the end of time itself the debt is paid.
    assert_eq!(l.reserve_n_at(Nanos::MAX, 1), Ok(Duration::ZERO));
}
