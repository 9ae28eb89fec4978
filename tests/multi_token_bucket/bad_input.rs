//! Bad input is a typed error, never a panic: no limits, five, zero rates and bursts, an
//! infinite rate, bursts past the packing's range; and extreme readings and weights.

use std::time::Duration;

use turnstile::keyed::multi_token_bucket::KeyedMultiTokenBucket;
use turnstile::multi_token_bucket::{Bandwidth, MultiTokenBucket};
use turnstile::{ConfigError, Limit, ManualClock, Nanos};

use crate::common;

fn build(limits: &[Bandwidth]) -> Result<MultiTokenBucket<ManualClock>, ConfigError> {
    MultiTokenBucket::builder(limits)
        .clock(ManualClock::default())
        .build()
}

fn out_of_range(e: ConfigError) -> usize {
    match e {
        ConfigError::LimitOutOfRange { index, .. } => index,
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_number_of_limits_is_one_to_four() {
    let l = Bandwidth::per(1, Duration::from_secs(1));
    assert_eq!(build(&[]).unwrap_err(), ConfigError::LimitCount(0));
    assert_eq!(build(&[l; 5]).unwrap_err(), ConfigError::LimitCount(5));
    for k in 1..=4 {
        assert!(build(&vec![l; k]).is_ok());
    }
    let b = build(&[l]).unwrap();
    assert_eq!(
        b.set_limits_at(Nanos::ZERO, &[l; 5]),
        Err(ConfigError::LimitCount(5))
    );
    assert_eq!(
        KeyedMultiTokenBucket::<u8>::builder(&[l; 5])
            .build()
            .unwrap_err(),
        ConfigError::LimitCount(5)
    );
}

#[test]
fn zero_and_infinite_rates_and_zero_bursts_are_refused() {
    let ok = Bandwidth::per(1, Duration::from_secs(1));
    for bad in [
        Bandwidth::new(Limit::ZERO, 5),
        Bandwidth::new(Limit::INF, 5),
        Bandwidth::new(Limit::per_second(1.0).unwrap(), 0),
        Bandwidth::per(0, Duration::from_secs(1)),
        Bandwidth::per(5, Duration::ZERO),
    ] {
        assert_eq!(out_of_range(build(&[ok, bad]).unwrap_err()), 1, "{bad:?}");
    }
}

#[test]
fn bursts_past_the_field_are_refused_and_the_largest_that_fit_work() {
    // Four limits: 21-bit fields. A burst of 2^21 tokens cannot fit; 2^20 - 1 at a slow rate
    // can (one unit per token).
    let slow = Limit::per_second(1.0).unwrap();
    let big = Bandwidth::new(slow, 1 << 21);
    assert_eq!(out_of_range(build(&[big; 4]).unwrap_err()), 0);
    let fits = Bandwidth::new(slow, (1 << 20) - 1);
    let b = build(&[fits; 4]).unwrap();
    assert!(b.check_n_at(Nanos::ZERO, (1 << 20) - 1).is_ok());
    assert!(b.check_n_at(Nanos::ZERO, 1).is_err());
    // Two limits hold u32::MAX bursts.
    let huge = Bandwidth::new(slow, u32::MAX);
    let b = build(&[huge; 2]).unwrap();
    assert!(b.check_n_at(Nanos::ZERO, u32::MAX).is_ok());
    // A rate so high that a millisecond's refill passes a 21-bit field.
    let fast = Bandwidth::new(Limit::per_second(1e10).unwrap(), 1);
    assert_eq!(out_of_range(build(&[fast; 4]).unwrap_err()), 0);
    // A rate so low that its burst never refills within 146 years.
    let glacial = Bandwidth::new(Limit::per_second(1e-12).unwrap(), 1000);
    assert_eq!(out_of_range(build(&[glacial]).unwrap_err()), 0);
}

#[test]
fn extreme_readings_and_weights_never_panic() {
    let limits = [
        Bandwidth::per(20, Duration::from_secs(1)).burst_of(40),
        Bandwidth::per(10_000, Duration::from_secs(86_400)),
    ];
    let b = build(&limits).unwrap();
    for t in common::extreme_times() {
        for n in [0, 1, 40, 41, u32::MAX] {
            let _ = b.check_n_at(t, n);
            let _ = b.peek_n_at(t, n);
        }
        let _ = b.status_at(t);
        b.set_limits_at(t, &limits).unwrap();
    }
    let k = KeyedMultiTokenBucket::<u8, _, _>::builder(&limits)
        .clock(ManualClock::default())
        .build()
        .unwrap();
    for t in common::extreme_times() {
        for n in [0, 1, u32::MAX] {
            let _ = k.check_n_at(&1, t, n);
        }
        let _ = k.status_at(&1, t);
        k.evict_idle_at(t);
    }
}

#[test]
fn one_or_two_limits_hold_rates_up_to_about_two_per_nanosecond() {
    // One or two limits keep each arrival time whole in a 59-bit field: every reading of the
    // 9.1-year range must fit in units no coarser than a token.
    let daily = Bandwidth::per(10_000, Duration::from_secs(86_400));
    let fits = Bandwidth::new(Limit::per_second(1.9e9).unwrap(), 1000);
    let b = build(&[daily, fits]).unwrap();
    assert!(b.check_n_at(Nanos::ZERO, 1000).is_ok());
    assert!(b.check_n_at(Nanos::ZERO, 1).is_err());
    assert_eq!(b.precision()[1], Duration::from_nanos(1));
    let past = Bandwidth::new(Limit::per_second(2e9).unwrap(), 1000);
    assert_eq!(out_of_range(build(&[past]).unwrap_err()), 0);
    assert_eq!(out_of_range(build(&[daily, past]).unwrap_err()), 1);
}

#[test]
fn a_reading_before_the_base_counts_as_the_base() {
    // Built at 5 s: the grids count from there, and an earlier reading is the base itself.
    let limits = [
        Bandwidth::per(20, Duration::from_secs(1)).burst_of(40),
        Bandwidth::per(10_000, Duration::from_secs(86_400)),
    ];
    let base = Nanos::new(5_000_000_000);
    let b = MultiTokenBucket::builder(&limits)
        .clock(ManualClock::new(base))
        .build()
        .unwrap();
    assert!(b.check_n_at(Nanos::ZERO, 40).is_ok());
    let d = b.check_n_at(Nanos::ZERO, 1).unwrap_err();
    assert_eq!(d.retry_at(), Some(Nanos::new(base.as_u64() + 50_000_000)));
    // A second after the base the burst limit has refilled 20.
    let later = Nanos::new(base.as_u64() + 1_000_000_000);
    assert!(b.check_n_at(later, 20).is_ok());
    assert!(b.check_n_at(later, 1).is_err());
}

#[test]
fn a_refused_check_at_the_end_of_the_range_never_reaches_the_epoch() {
    // Near the end of the range a wide field holds the reading's units, up to 2^59, and a
    // check that is refused computes an arrival time a burst past what a grant may leave: it
    // must stay within its field, for above limit 1's field are the configuration's epoch's
    // bits, all set after 31 reconfigurations. Over many rates (the field's grid, and so how
    // full it is, moves with the rate) a second burst at the last reading is refused by
    // limit 1, and the bucket goes on as before.
    let end = Nanos::new((1 << 58) - 1);
    let burst = 1 << 20;
    for i in 0..48 {
        let rate = 1e-3 * 1.5f64.powi(i);
        let limits = [
            Bandwidth::new(Limit::per_second(1e9).unwrap(), 2 * burst),
            Bandwidth::new(Limit::per_second(rate).unwrap(), burst),
        ];
        let b = build(&limits).unwrap();
        for _ in 0..31 {
            b.set_limits_at(Nanos::ZERO, &limits).unwrap();
        }
        assert!(b.check_n_at(end, burst).is_ok(), "{rate}/s");
        let d = b.check_n_at(end, burst).unwrap_err();
        assert_eq!(d.limit(), 1, "{rate}/s");
        assert_eq!(b.status_at(end)[1].remaining, 0, "{rate}/s");
        b.set_limits_at(end, &limits).unwrap();
        assert_eq!(b.limits(), limits.to_vec());
        assert!(b.check_n_at(end, 1).is_err(), "{rate}/s");
    }
}
