//! The precision and range of `TokenBucket`'s 64-bit state word (see "Precision and range" in
//! `src/token_bucket.rs`): grants never drift from `limit * elapsed`, at any limit, over long
//! simulated spans, including across the rebases that keep readings in the word's range.

use turnstile::{Limit, Limiter, ManualClock, Nanos, TokenBucket};

const SEC: u64 = 1_000_000_000;
const HOUR: u64 = 3600 * SEC;

fn bucket(limit: f64, burst: u32) -> TokenBucket<ManualClock> {
    TokenBucket::builder(Limit::per_second(limit).unwrap(), burst)
        .clock(ManualClock::default())
        .build()
}

/// Takes every whole token the bucket holds at each of `steps` irregular instants from
/// `start` to `start + span`, checking that one more is refused; returns the tokens granted.
fn drain_over(tb: &TokenBucket<ManualClock>, start: u64, span: u64, steps: u64) -> u64 {
    let mut total = 0u64;
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for i in 1..=steps {
        // Irregular instants (never aligned with the token interval), ending at exactly the end.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let jitter = if i == steps {
            0
        } else {
            x % (span / steps / 2)
        };
        let t = Nanos::new(start + span / steps * i - jitter);
        let avail = tb.tokens_at(t).floor().max(0.0) as u64;
        let n = u32::try_from(avail).expect("per-step refill fits a u32");
        if u64::from(n) < u64::from(tb.burst()) {
            assert!(!tb.allow_n_at(t, n + 1), "{n} + 1 granted at {t:?}");
        }
        if n > 0 {
            assert!(tb.allow_n_at(t, n), "{n} refused at {t:?}");
        }
        total += avail;
    }
    total
}

/// The burst for `limit`: large enough that no step's refill hits the cap, small enough that
/// refilling it takes less than the 146 years past which a limit never refills.
fn burst_for(limit: f64) -> u32 {
    (limit * 1e6).clamp(1000.0, f64::from(u32::MAX)) as u32
}

#[test]
fn an_hour_of_grants_is_exact_at_every_limit() {
    // Every quarter decade from 1e-3/s to 1e8/s, and values whose interval is not a whole
    // number of nanoseconds (or of units).
    let mut limits: Vec<f64> = (0..=44)
        .map(|i| 1e-3 * 10f64.powf(f64::from(i) / 4.0))
        .collect();
    limits.extend([1.0 / 3.0, 7.0, 333.3, 3e7, 9.99e7, 1e8]);
    for limit in limits {
        let burst = burst_for(limit);
        let tb = bucket(limit, burst);
        assert!(tb.allow_n_at(Nanos::ZERO, burst), "limit {limit}: drain");
        let total = drain_over(&tb, 0, HOUR, 2_000) as f64;
        let expected = limit * 3600.0;
        let tolerance = (1e-6 * expected).max(1.0);
        assert!(
            (total - expected).abs() <= tolerance,
            "limit {limit}/s: {total} granted in an hour, expected {expected} (± {tolerance})"
        );
    }
}

#[test]
fn grants_stay_exact_across_rebases() {
    // 1e7/s: the hot range is ~41 days (2^56 units of 1/20 ns); 90 days of readings rebase
    // the configuration twice, each a reconfiguration at the reading. (A step refills at most
    // 5.8e8 tokens, well below the burst, so no refill is lost to the cap.)
    let limit = 1e7;
    let burst = u32::MAX;
    let tb = bucket(limit, burst);
    assert!(tb.allow_n_at(Nanos::ZERO, burst));
    let span = 90 * 24 * HOUR;
    let total = drain_over(&tb, 0, span, 200_000) as f64;
    let expected = limit * (span / SEC) as f64;
    assert!(
        (total - expected).abs() <= (1e-6 * expected).max(1.0),
        "{total} granted in 90 days, expected {expected}"
    );
}

#[test]
fn a_jump_to_the_end_of_time_rebases_and_earlier_readings_find_nothing() {
    let tb = bucket(1000.0, 10);
    assert!(tb.allow_n_at(Nanos::new(SEC), 10));
    let far = Nanos::new(u64::MAX - SEC);
    assert_eq!(tb.tokens_at(far), 10.0);
    assert!(tb.allow_n_at(far, 10));
    assert!(!tb.allow_at(far));
    // D2: a reading from before the jump finds no token the later reading did not leave.
    assert!(!tb.allow_at(Nanos::new(2 * SEC)));
    // And refill continues at the far end.
    assert!(tb.allow_at(Nanos::new(u64::MAX - SEC + 1_000_000)));
    assert!(tb.allow_n_at(Nanos::MAX, 10));
    assert!(!tb.allow_at(Nanos::MAX));
}

/// `check` refuses a reading two nanoseconds or more before its retry time from the retry
/// time alone, and compares the last nanosecond exactly, as `allow` compares every reading.
/// Far from the base, where a reading's units can round up to the next token's, the two agree
/// at one and two nanoseconds before each retry time and at it, at limits whose units do not
/// divide a nanosecond, at whole-nanosecond ones, and at limits whose units are coarser than
/// a nanosecond, where every reading is compared exactly. A check handed its time
/// (`check_n_at`) and one reading the clock (`check_n`) take different inline paths to their
/// refusal; both are checked, reading for reading.
#[test]
fn a_check_near_its_retry_time_agrees_with_allow() {
    let mut near = 0;
    // Units under a nanosecond from 7.5/s up; at 0.3/s and 1e-3/s they are 1.6 ns and 466 ns,
    // and a reading's units may round up by a quarter of one at 2^56 ns, by all of it at 2^58.
    let starts = [
        (1e-3, 1 << 57),
        (0.3, 1 << 56),
        (7.7, 1 << 50),
        (3e5, 1 << 50),
    ];
    let more = [123_456.7, 1e6, 2.9e7, 3e8].map(|l| (l, 1u64 << 50));
    for (limit, start) in starts.into_iter().chain(more) {
        let (checked, clocked, allowed) = (bucket(limit, 3), bucket(limit, 3), bucket(limit, 3));
        // Both checks at `now`: the same answer, retry time included.
        let check = |now: Nanos| {
            let passed = checked.check_n_at(now, 1);
            clocked.clock().set(now);
            assert_eq!(clocked.check_n(1), passed, "limit {limit} at {now:?}");
            passed
        };
        let mut t = start;
        for _ in 0..20_000 {
            let retry = loop {
                let now = Nanos::new(t);
                match check(now) {
                    Ok(()) => assert!(allowed.allow_at(now), "limit {limit} at {t}"),
                    Err(d) => {
                        assert!(!allowed.allow_at(now), "limit {limit} at {t}");
                        break d.retry_at().unwrap().as_u64();
                    }
                }
            };
            for at in [retry - 2, retry - 1, retry] {
                let now = Nanos::new(at);
                let granted = check(now).is_ok();
                assert_eq!(granted, allowed.allow_at(now), "limit {limit} at {at}");
                if granted {
                    near += u32::from(at < retry);
                    t = at;
                    break;
                }
            }
        }
    }
    // Some grants came a nanosecond before the retry time (a reading's units rounding up).
    assert!(near > 0, "no grant before a retry time");
}
