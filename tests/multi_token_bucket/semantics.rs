//! `MultiTokenBucket` semantics: all or nothing, which limit refuses and when all admit,
//! peeks, status, `set_limits`, the range's end, and the keyed map's per-key words.

use std::time::Duration;

use turnstile::keyed::multi_token_bucket::KeyedMultiTokenBucket;
use turnstile::multi_token_bucket::{Bandwidth, MultiTokenBucket};
use turnstile::{Idle, Limit, Limiter, ManualClock, Nanos};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;
const DAY: Duration = Duration::from_secs(86_400);

fn at(ns: u64) -> Nanos {
    Nanos::new(ns)
}

fn bucket(limits: &[Bandwidth]) -> MultiTokenBucket<ManualClock> {
    MultiTokenBucket::builder(limits)
        .clock(ManualClock::default())
        .build()
        .unwrap()
}

/// governor #156 and pubky-homeserver #573: a per-second refusal must not spend the daily
/// quota, and a daily refusal must not spend the per-second one.
#[test]
fn a_refusal_by_one_limit_takes_nothing_from_the_others() {
    let b = bucket(&[
        Bandwidth::per(2, Duration::from_secs(1)),
        Bandwidth::per(5, DAY),
    ]);
    for s in 0..2 {
        assert!(b.check_n_at(at(s * SEC), 2).is_ok());
        // The per-second limit refuses; the daily one keeps its tokens.
        assert_eq!(b.check_n_at(at(s * SEC), 1).unwrap_err().limit(), 0);
    }
    assert_eq!(b.status_at(at(2 * SEC))[1].remaining, 1);
    // Now the daily one refuses: the per-second one stays full.
    assert_eq!(b.check_n_at(at(2 * SEC), 2).unwrap_err().limit(), 1);
    assert_eq!(b.status_at(at(2 * SEC))[0].remaining, 2);
    assert!(b.check_n_at(at(2 * SEC), 1).is_ok());
}

#[test]
fn the_retry_time_is_when_every_limit_admits() {
    // 10/s burst 1 and 1/s burst 3: after 3 at 0 s (0.2 s apart), the second limit is empty.
    let b = bucket(&[
        Bandwidth::new(Limit::per_second(10.0).unwrap(), 1),
        Bandwidth::new(Limit::per_second(1.0).unwrap(), 3),
    ]);
    for i in 0..3 {
        assert!(b.check_at(at(i * 200 * MS)).is_ok());
    }
    let d = b.check_at(at(400 * MS)).unwrap_err();
    assert_eq!((d.limit(), d.retry_at()), (1, Some(at(SEC))));
    assert!(b.check_at(at(SEC - 1)).is_err());
    assert!(b.check_at(at(SEC)).is_ok());
    // Right after, both refuse: the first until 1.1 s, the second until 2 s, which binds.
    let d = b.check_at(at(SEC)).unwrap_err();
    assert_eq!((d.limit(), d.retry_at()), (1, Some(at(2 * SEC))));
    assert!(b.check_at(at(2 * SEC)).is_ok());
    // More than a burst: never, named by the first limit it passes.
    let d = b.check_n_at(at(10 * SEC), 2).unwrap_err();
    assert_eq!((d.limit(), d.retry_at()), (0, None));
}

/// Three or four limits count a reading up to two units early (`precision()`); a refusal's
/// retry time must still be one at which the check is granted, within the precision of the
/// exact twin's (while the two agree). Rates that are no whole number of units per anchor grain, so that readings
/// round differently inside and across grains.
#[test]
fn a_retry_time_admits_and_is_never_early_for_four_limits() {
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let (mut checked, mut past_grain) = (0, 0);
    for _ in 0..1_000 {
        let limits: Vec<Bandwidth> = (0..4)
            .map(|_| {
                let per_second = 0.5 + (next() % 100_000) as f64 / 7.0;
                Bandwidth::new(
                    Limit::per_second(per_second).unwrap(),
                    1 + next() as u32 % 20,
                )
            })
            .collect();
        let Ok(b) = MultiTokenBucket::builder(&limits)
            .clock(ManualClock::default())
            .build()
        else {
            continue;
        };
        let twin =
            turnstile::reference::MultiTokenBucket::with_clock(&limits, ManualClock::default())
                .unwrap();
        // The twin's state may lead by the precision too (module docs of `differential`).
        let slack = 2 * b.precision().iter().max().unwrap().as_nanos() as u64 + 2;
        let mut t = next() % (10 * SEC);
        for _ in 0..40 {
            let n = 1 + next() as u32 % 3;
            let (mine, exact) = (b.check_n_at(at(t), n), twin.check_n_at(at(t), n));
            match (mine, exact) {
                (Err(d), Err(e)) if d.retry_at().is_some() => {
                    let retry = d.retry_at().unwrap();
                    let exact = e.retry_at().unwrap().as_u64();
                    assert!(
                        retry.as_u64().abs_diff(exact) <= slack,
                        "{limits:?} n {n} at {t}"
                    );
                    assert!(b.peek_n_at(retry, n).is_ok(), "{limits:?} n {n} at {t}");
                    checked += 1;
                    past_grain += usize::from(retry.as_u64() >> 20 != t >> 20);
                    t = retry.as_u64();
                }
                (Ok(_), Ok(_)) => t += next() % (2 * MS),
                // Within the precision of a boundary: the two states part here.
                _ => break,
            }
        }
    }
    assert!(
        checked > 1_000 && past_grain > 500,
        "{checked} refusals, {past_grain} past the grain"
    );
}

#[test]
fn peeks_and_zero_checks_take_nothing() {
    let b = bucket(&[
        Bandwidth::per(3, Duration::from_secs(1)),
        Bandwidth::per(4, DAY),
    ]);
    for _ in 0..5 {
        assert!(b.peek_n_at(at(0), 3).is_ok());
        assert!(b.check_n_at(at(0), 0).is_ok());
    }
    assert!(b.check_n_at(at(0), 3).is_ok());
    let p = b.peek_n_at(at(0), 1).unwrap_err();
    let c = b.check_n_at(at(0), 1).unwrap_err();
    assert_eq!(p, c);
    assert!(b.is_idle_at(at(DAY.as_nanos() as u64)));
    assert!(!b.is_idle_at(at(SEC)));
}

#[test]
fn status_gives_every_limit() {
    let b = bucket(&[
        Bandwidth::per(10, Duration::from_secs(1)),
        Bandwidth::per(100, DAY),
    ]);
    b.check_n_at(at(0), 10).unwrap();
    let s = b.status_at(at(500 * MS));
    assert_eq!(s.len(), 2);
    assert_eq!((s[0].quota, s[0].remaining), (10, 5));
    assert_eq!(s[0].reset, Duration::from_millis(500));
    assert_eq!((s[1].quota, s[1].remaining, s[1].window), (100, 90, DAY));
    assert_eq!(s.binding(), s[0]);
    assert_eq!(Limiter::quota_at(&b, at(500 * MS)), Some(s[0]));
}

#[test]
fn set_limits_keeps_tokens_by_position_and_adds_full_limits() {
    let sec = Duration::from_secs(1);
    let b = bucket(&[Bandwidth::per(10, sec), Bandwidth::per(100, DAY)]);
    b.check_n_at(at(0), 6).unwrap();
    // Tighter burst: 4 kept (capped at the new burst, 3); the daily limit is dropped.
    b.set_limits_at(at(0), &[Bandwidth::per(3, sec)]).unwrap();
    assert_eq!(b.status_at(at(0)).len(), 1);
    assert_eq!(b.status_at(at(0))[0].remaining, 3);
    // Added back, full.
    b.set_limits_at(at(0), &[Bandwidth::per(3, sec), Bandwidth::per(5, DAY)])
        .unwrap();
    assert_eq!(b.status_at(at(0))[1].remaining, 5);
    assert!(b.check_n_at(at(0), 3).is_ok());
    // An invalid list changes nothing.
    assert!(b.set_limits_at(at(0), &[]).is_err());
    assert_eq!(b.limits().len(), 2);
}

#[test]
fn past_the_range_time_stands_still_and_fails_closed() {
    let b = bucket(&[
        Bandwidth::per(2, Duration::from_secs(1)),
        Bandwidth::per(4, DAY),
    ]);
    let end = at(u64::MAX);
    assert!(b.check_n_at(end, 2).is_ok());
    let d = b.check_n_at(end, 1).unwrap_err();
    assert!(d.retry_at().is_some());
    assert!(b.check_n_at(at(u64::MAX - 1), 1).is_err());
}

#[test]
fn stale_readings_get_no_more_than_the_latest() {
    let b = bucket(&[
        Bandwidth::per(2, Duration::from_secs(1)),
        Bandwidth::per(3, DAY),
    ]);
    assert!(b.check_n_at(at(10 * SEC), 2).is_ok());
    // A reading from before that grant finds the per-second limit empty, not full.
    assert_eq!(b.check_n_at(at(9 * SEC), 1).unwrap_err().limit(), 0);
    assert!(b.check_n_at(at(11 * SEC), 1).is_ok());
    assert_eq!(b.check_n_at(at(12 * SEC), 1).unwrap_err().limit(), 1);
}

/// Four limits keep offsets from an anchor that a later reading moves: a stale reading
/// (before the anchor) takes its own tokens and no more, and leaves the anchor where it is.
#[test]
fn a_stale_reading_takes_only_its_tokens_from_four_limits() {
    let limits = [
        Bandwidth::per(10, Duration::from_secs(1)),
        Bandwidth::per(100, Duration::from_secs(60)),
        Bandwidth::per(1_000, Duration::from_secs(3_600)),
        Bandwidth::per(5_000, DAY),
    ];
    let b = bucket(&limits);
    assert!(b.check_n_at(at(10 * SEC), 3).is_ok());
    // 5 ms earlier: a stale reading, in an earlier grain than the anchor.
    assert!(b.check_n_at(at(10 * SEC - 5 * MS), 2).is_ok());
    let left: Vec<u64> = b
        .status_at(at(10 * SEC))
        .iter()
        .map(|s| s.remaining)
        .collect();
    assert_eq!(left, [5, 95, 995, 4_995]);
    // The word stayed anchored at 10 s: 0.5 s later the first limit has 5 more.
    assert!(b.check_n_at(at(10 * SEC + 500 * MS), 10).is_ok());
    assert!(b.check_at(at(10 * SEC + 500 * MS)).is_err());
}

#[test]
fn keyed_words_are_independent_and_all_or_nothing() {
    let k = KeyedMultiTokenBucket::<u32, _, _>::builder(&[
        Bandwidth::per(2, Duration::from_secs(1)),
        Bandwidth::per(3, DAY),
    ])
    .quota(&[Bandwidth::per(100, Duration::from_secs(1))])
    .classify(|k| usize::from(*k >= 100))
    .clock(ManualClock::default())
    .build()
    .unwrap();
    assert!(k.check_n_at(&1, at(0), 2).is_ok());
    assert!(k.check_n_at(&1, at(0), 1).is_err());
    assert!(k.check_n_at(&2, at(0), 2).is_ok());
    assert!(k.check_n_at(&1, at(SEC), 1).is_ok());
    let d = k.check_n_at(&1, at(2 * SEC), 1).unwrap_err();
    assert_eq!(d.retry_at(), Some(at(DAY.as_nanos() as u64 / 3)));
    assert_eq!(k.status_at(&1, at(2 * SEC))[0].remaining, 2); // untouched by the refusal
    assert!(k.check_n_at(&100, at(0), 100).is_ok()); // quota 1
    assert_eq!(k.status_at(&100, at(0)).len(), 1);
    assert_eq!(k.evict_idle_at(at(DAY.as_nanos() as u64)), 3);
}
