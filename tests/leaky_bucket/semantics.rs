//! The rules of uber-go/ratelimit's int64 limiter (seed-semantics §2.4, v0.3.1) on the
//! lock-free `LeakyBucket` and on its mutex twin, one test per rule, plus deviations D6/D7 and
//! the things only turnstile has (a first take at time 0, `try_take` writing nothing, the
//! `Limiter` check, blocking and async takes). Times are explicit (`_at` forms) unless the test
//! is about sleeping.

use std::time::{Duration, Instant};

use turnstile::{Clock, ConfigError, LeakyBucket, Limiter, ManualClock, Nanos};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;
/// Upstream's tests set their mock clock to `time.Now()`; any time well after 0 will do.
const T0: u64 = 1_000 * SEC;

fn at(ns: u64) -> Nanos {
    Nanos::new(ns)
}

/// The rules every implementation shares, run on the lock-free bucket and on the twin. Each
/// module builds its buckets with `lb(rate, per, slack)` on a manual clock.
macro_rules! shared_rules {
    ($module:ident, $($path:tt)+) => {
        mod $module {
            use super::*;
            use $($path)+ as Bucket;

            type Lb = Bucket<ManualClock>;

            fn lb(rate: u32, per: Duration, slack: u32) -> Lb {
                Bucket::try_from(turnstile::LeakyBucket::builder(rate)
                    .per(per)
                    .slack(slack)
                    .clock(ManualClock::new(at(T0))))
                    .unwrap()
            }

            fn per_second(rate: u32, slack: u32) -> Lb {
                lb(rate, Duration::from_secs(1), slack)
            }

            #[test]
            fn first_take_is_immediate_and_returns_now() {
                let l = per_second(10, 10);
                assert_eq!(l.take_at(at(T0 + 5)), at(T0 + 5));
                // Credit starts at 0: the second take at the same time waits one perRequest.
                assert_eq!(l.take_at(at(T0 + 5)), at(T0 + 5 + 100 * MS));
            }

            #[test]
            fn per_request_truncates_like_go() {
                assert_eq!(
                    per_second(3, 10).per_request(),
                    Duration::from_nanos(333_333_333)
                );
                let l = lb(7, Duration::from_secs(60), 0);
                assert_eq!(l.per_request(), Duration::from_nanos(8_571_428_571));
                assert_eq!(l.take_at(at(T0)), at(T0));
                assert_eq!(l.take_at(at(T0)), at(T0 + 8_571_428_571));
                assert_eq!(l.take_at(at(T0)), at(T0 + 2 * 8_571_428_571));
                let l = per_second(3, 0);
                l.take_at(at(T0));
                assert_eq!(l.take_at(at(T0)), at(T0 + 333_333_333));
                assert_eq!(l.take_at(at(T0)), at(T0 + 666_666_666));
            }

            #[test]
            fn defaults_are_one_second_and_slack_ten() {
                let l = Bucket::try_from(turnstile::LeakyBucket::builder(5).clock(ManualClock::default())).unwrap();
                assert_eq!(l.per(), Duration::from_secs(1));
                assert_eq!(l.slack(), 10);
                assert_eq!(l.rate(), 5);
                let l = Bucket::new(5).unwrap();
                assert_eq!((l.per(), l.slack()), (Duration::from_secs(1), 10));
            }

            #[test]
            fn options_apply_in_order_last_wins() {
                let b = || turnstile::LeakyBucket::builder(10).clock(ManualClock::default());
                let build = |options| Bucket::try_from(options).unwrap();
                assert_eq!(build(b().slack(5).without_slack()).slack(), 0);
                assert_eq!(build(b().without_slack().slack(3)).slack(), 3);
                let l = build(
                    b().per(Duration::from_secs(60))
                        .per(Duration::from_millis(10)),
                );
                assert_eq!(l.per_request(), Duration::from_millis(1));
                // A zero per set first and then corrected is fine; the last one counts.
                assert!(Bucket::try_from(b().per(Duration::ZERO).per(Duration::from_secs(1))).is_ok());
            }

            #[test]
            fn slack_plus_one_immediate_after_idling_then_spacing() {
                for slack in [0u32, 1, 2, 10] {
                    let l = per_second(10, slack);
                    assert_eq!(l.take_at(at(T0)), at(T0));
                    let t1 = at(T0 + 60 * SEC);
                    for i in 0..=slack {
                        assert_eq!(l.take_at(t1), t1, "slack {slack}: take {i} is immediate");
                    }
                    for k in 1..5u64 {
                        assert_eq!(
                            l.take_at(t1),
                            at(t1.as_u64() + k * 100 * MS),
                            "slack {slack}: then perRequest spacing"
                        );
                    }
                }
            }

            #[test]
            fn idle_time_less_one_per_request_is_banked_as_partial_slack() {
                let l = per_second(10, 10);
                l.take_at(at(T0));
                // 500 ms idle (within maxSlack + perRequest): 5 takes are due at once.
                let t1 = at(T0 + 500 * MS);
                for _ in 0..5 {
                    assert_eq!(l.take_at(t1), t1);
                }
                assert_eq!(l.take_at(t1), at(T0 + 600 * MS));
            }

            /// Issue #119 (fixed by PR #124 in v0.3.1): the cap condition was `now - prev >
            /// maxSlack`. After one long pause, a caller taking more often than perRequest kept
            /// `next` exactly maxSlack behind, hit the cap branch on every take and was never
            /// limited again. With `> maxSlack + perRequest` the banked credit drains.
            #[test]
            fn slack_cap_after_idling_drains_instead_of_reapplying_issue_119() {
                let l = per_second(10, 10);
                l.take_at(at(T0));
                let t1 = T0 + 3_600 * SEC;
                // One take per millisecond for one second after the pause.
                let mut immediate = 0;
                let mut last_permit = at(0);
                for ms in 0..1_000u64 {
                    let now = at(t1 + ms * MS);
                    let p = l.take_at(now);
                    assert!(p >= last_permit, "permits are monotonic");
                    if p == now {
                        immediate += 1;
                    }
                    last_permit = p;
                }
                // slack + 1 at once, then at most one per 100 ms (the twin catches up: permits
                // later than now are not immediate).
                assert!(immediate <= 11 + 10, "{immediate} immediate permits: not limited");
                assert!(immediate >= 11, "{immediate} immediate permits: slack not applied");
            }

            #[test]
            fn credit_is_capped_at_slack_however_long_the_idle() {
                let l = per_second(10, 10);
                l.take_at(at(T0));
                for idle in [2 * SEC, 60 * SEC, 86_400 * SEC] {
                    let l = per_second(10, 10);
                    l.take_at(at(T0));
                    let t1 = at(T0 + idle);
                    let immediate = (0..100).take_while(|_| l.take_at(t1) == t1).count();
                    assert_eq!(immediate, 11, "idle {idle} ns");
                }
            }

            #[test]
            fn without_slack_idling_banks_nothing() {
                let l = lb(10, Duration::from_secs(1), 0);
                l.take_at(at(T0));
                let t1 = at(T0 + 10 * SEC);
                assert_eq!(l.take_at(t1), t1);
                assert_eq!(l.take_at(t1), at(t1.as_u64() + 100 * MS));
                // A late caller (more than perRequest after the last permit) restarts at now.
                let t2 = at(t1.as_u64() + 350 * MS);
                assert_eq!(l.take_at(t2), t2);
                assert_eq!(l.take_at(t2), at(t2.as_u64() + 100 * MS));
                // Exactly perRequest after the last permit: the default branch, still immediate.
                let l = lb(10, Duration::from_secs(1), 0);
                l.take_at(at(T0));
                assert_eq!(l.take_at(at(T0 + 100 * MS)), at(T0 + 100 * MS));
                assert_eq!(l.take_at(at(T0 + 100 * MS)), at(T0 + 200 * MS));
            }

            #[test]
            fn permits_queue_up_for_callers_that_do_not_wait() {
                let l = per_second(4, 0);
                let ts: Vec<_> = (0..5).map(|_| l.take_at(at(T0))).collect();
                assert_eq!(
                    ts,
                    (0..5u64).map(|k| at(T0 + k * 250 * MS)).collect::<Vec<_>>()
                );
            }

            #[test]
            fn an_earlier_time_gets_no_extra_permit() {
                let l = per_second(10, 2);
                l.take_at(at(T0 + 10 * SEC));
                // Going back a long way lands in the default branch: prev + perRequest.
                assert_eq!(l.take_at(at(T0)), at(T0 + 10 * SEC + 100 * MS));
                assert!(!l.try_take_at(at(T0)));
                assert!(!l.try_take_at(at(T0 + 10 * SEC)));
                assert_eq!(l.take_at(at(T0 + 10 * SEC)), at(T0 + 10 * SEC + 200 * MS));
            }

            #[test]
            fn try_take_succeeds_exactly_when_take_would_not_wait() {
                let l = per_second(10, 1);
                assert!(l.try_take_at(at(T0)));
                assert!(!l.try_take_at(at(T0)));
                assert!(!l.try_take_at(at(T0 + 100 * MS - 1)));
                assert!(l.try_take_at(at(T0 + 100 * MS)));
                let t1 = at(T0 + 10 * SEC);
                assert!(l.try_take_at(t1) && l.try_take_at(t1));
                assert!(!l.try_take_at(t1));
            }

            #[test]
            fn try_take_changes_nothing_when_denied() {
                let l = per_second(10, 3);
                let twin = per_second(10, 3); // gets only the operations that succeed
                for b in [&l, &twin] {
                    b.take_at(at(T0));
                    b.take_at(at(T0));
                }
                for k in 0..1_000u64 {
                    assert!(!l.try_take_at(at(T0 + k * 100)));
                    assert!(l.check_n_at(at(T0 + k * 100), 2).is_err());
                }
                for t in [T0, T0 + 150 * MS, T0 + 250 * MS, T0 + 3 * SEC] {
                    assert_eq!(l.take_at(at(t)), twin.take_at(at(t)));
                }
            }

            #[test]
            fn check_n_is_n_consecutive_immediate_takes() {
                let l = per_second(10, 3);
                assert!(l.check_n_at(at(T0), 0).is_ok(), "zero permits always pass");
                assert!(l.check_n_at(at(T0), 1).is_ok());
                let t1 = at(T0 + 10 * SEC);
                assert!(l.check_n_at(t1, 4).is_ok(), "slack + 1 at once after idling");
                assert_eq!(l.take_at(t1), at(t1.as_u64() + 100 * MS), "all four taken");
                // Partial credit: after 250 ms, two permits are due (the next at +300 ms).
                let l = per_second(10, 3);
                l.take_at(at(T0));
                let t2 = at(T0 + 250 * MS);
                let d = l.check_n_at(t2, 3).unwrap_err();
                assert_eq!(d.retry_at(), Some(at(T0 + 300 * MS)));
                assert_eq!(d.checked_at(), t2);
                assert!(l.check_n_at(at(T0 + 300 * MS - 1), 3).is_err());
                assert!(l.check_n_at(at(T0 + 300 * MS), 3).is_ok());
                assert_eq!(l.take_at(at(T0 + 300 * MS)), at(T0 + 400 * MS));
            }

            #[test]
            fn check_n_says_never_when_it_never_can() {
                let l = per_second(10, 3);
                // Before the first permit a take banks no credit: two at once never pass.
                assert_eq!(l.check_n_at(at(T0), 2).unwrap_err().retry_at(), None);
                assert!(l.check_n_at(at(T0 + 100 * SEC), 2).is_err());
                assert!(l.check_n_at(at(T0), 1).is_ok());
                // More than slack + 1 never passes, however long the idle.
                assert_eq!(
                    l.check_n_at(at(T0 + 100 * SEC), 5).unwrap_err().retry_at(),
                    None
                );
                assert!(l.check_n_at(at(T0 + 100 * SEC), 4).is_ok());
            }

            #[test]
            fn retry_at_is_exact() {
                let l = per_second(10, 0);
                l.take_at(at(T0));
                let d = l.check_n_at(at(T0 + 30 * MS), 1).unwrap_err();
                assert_eq!(d.retry_after(), Some(Duration::from_millis(70)));
                assert!(!l.try_take_at(at(T0 + 100 * MS - 1)));
                assert!(l.try_take_at(at(T0 + 100 * MS)));
            }

            #[test]
            fn limiter_trait_works_generically() {
                fn admit<L: Limiter>(l: &L, now: Nanos) -> bool {
                    l.check_n_at(now, 1).is_ok()
                }
                let l = per_second(1, 0);
                assert!(admit(&l, at(T0)));
                assert!(!admit(&l, at(T0)));
                assert_eq!(l.clock().now(), at(T0));
            }

            #[test]
            fn unlimited_never_limits() {
                let l = Bucket::try_from(turnstile::LeakyBucket::builder(1).unlimited().clock(ManualClock::new(at(T0)))).unwrap();
                assert!(l.is_unlimited());
                for _ in 0..1000 {
                    assert_eq!(l.take_at(at(T0)), at(T0));
                    assert!(l.try_take_at(at(T0)));
                }
                assert!(l.check_n_at(at(T0), u32::MAX).is_ok());
                assert_eq!(l.take(), at(T0));
                assert!(Bucket::unlimited().try_take());
            }

            #[test]
            fn take_sleeps_until_the_permit() {
                let l = Bucket::try_from(turnstile::LeakyBucket::builder(200).without_slack()).unwrap(); // 5 ms apart
                let start = Instant::now();
                let first = l.take();
                let mut last = first;
                for _ in 0..4 {
                    let p = l.take();
                    assert!(l.clock().now() >= p, "woke before the permit");
                    assert!(p >= last + Duration::from_millis(5));
                    last = p;
                }
                assert!(start.elapsed() >= Duration::from_millis(19));
            }

            #[test]
            fn take_on_a_manual_clock_is_released_when_the_clock_is_moved() {
                let clock = ManualClock::new(at(T0));
                // One permit an hour: released by the clock's move, not by an hour's sleep
                // (a bound of a minute holds on any loaded machine and still tells them apart).
                let hour = Duration::from_secs(3_600);
                let l = Bucket::try_from(turnstile::LeakyBucket::builder(1).per(hour).without_slack().clock(clock.clone())).unwrap();
                assert_eq!(l.take(), at(T0));
                let start = Instant::now();
                std::thread::scope(|s| {
                    s.spawn(|| {
                        std::thread::sleep(Duration::from_millis(20));
                        clock.advance(hour);
                    });
                    assert_eq!(l.take(), at(T0 + 3_600 * SEC));
                });
                assert!(start.elapsed() < Duration::from_secs(60), "not the 1 h real wait");
            }

            #[cfg(feature = "tokio")]
            #[tokio::test(start_paused = true)]
            async fn take_async_sleeps_on_tokios_timer() {
                let l = per_second(10, 0);
                let t = tokio::time::Instant::now();
                assert_eq!(l.take_async().await, at(T0));
                assert_eq!(l.take_async().await, at(T0 + 100 * MS));
                assert_eq!(l.take_async().await, at(T0 + 200 * MS));
                assert_eq!(t.elapsed(), Duration::from_millis(300));
            }

            #[cfg(feature = "tokio")]
            #[tokio::test(start_paused = true)]
            async fn dropped_take_async_keeps_its_permit() {
                use std::future::Future;
                let l = per_second(10, 0);
                l.take_at(at(T0));
                let mut fut = Box::pin(l.take_async());
                // Poll once: the permit (at +100 ms) is taken, then the future sleeps.
                let waker = std::task::Waker::noop();
                let mut cx = std::task::Context::from_waker(waker);
                assert!(fut.as_mut().poll(&mut cx).is_pending());
                drop(fut);
                assert_eq!(l.take_at(at(T0)), at(T0 + 200 * MS), "the permit stays taken");
            }

            #[test]
            fn rate_zero_and_per_zero_are_typed_errors_d6() {
                assert_eq!(Bucket::new(0).unwrap_err(), ConfigError::ZeroRate);
                assert_eq!(
                    Bucket::try_from(turnstile::LeakyBucket::builder(1).per(Duration::ZERO)).unwrap_err(),
                    ConfigError::ZeroPeriod
                );
                assert_eq!(
                    Bucket::try_from(turnstile::LeakyBucket::builder(0).per(Duration::ZERO)).unwrap_err(),
                    ConfigError::ZeroRate
                );
            }
        }
    };
}

shared_rules!(lock_free, turnstile::LeakyBucket);
shared_rules!(twin, turnstile::reference::LeakyBucket);

// ---- turnstile only ------------------------------------------------------------------------

fn lb(rate: u32, slack: u32) -> LeakyBucket<ManualClock> {
    LeakyBucket::builder(rate)
        .slack(slack)
        .clock(ManualClock::default())
        .build()
        .unwrap()
}

#[test]
fn a_first_take_at_time_zero_is_a_first_take_like_any_other() {
    let l = lb(10, 10);
    assert_eq!(l.take_at(Nanos::ZERO), Nanos::ZERO);
    assert_eq!(l.take_at(Nanos::ZERO), at(100 * MS));
    assert!(!l.try_take_at(Nanos::ZERO));
    // Slack accrues from a state of 0 like from any other.
    let t1 = at(10 * SEC);
    assert_eq!((0..20).take_while(|_| l.take_at(t1) == t1).count(), 11);
}

#[test]
fn the_twin_keeps_upstreams_zero_sentinel() {
    // Upstream: "a clock reading exactly the Unix epoch makes every call look like a first
    // call". The twin is literal; turnstile is not (above).
    let twin = turnstile::reference::LeakyBucket::try_from(
        turnstile::LeakyBucket::builder(10).clock(ManualClock::default()),
    )
    .unwrap();
    for _ in 0..5 {
        assert_eq!(twin.take_at(Nanos::ZERO), Nanos::ZERO);
    }
    assert!(twin.check_n_at(Nanos::ZERO, 1_000).is_ok());
}

#[test]
fn rate_above_per_in_nanoseconds_spaces_permits_by_time_only() {
    // perRequest truncates to 0 (upstream too): nothing waits, the state follows the clock.
    let l = LeakyBucket::builder(u32::MAX)
        .clock(ManualClock::default())
        .build()
        .unwrap();
    assert_eq!(l.per_request(), Duration::ZERO);
    for t in [0u64, 0, 5, 5, 9] {
        assert_eq!(l.take_at(at(t)), at(t));
    }
    assert!(l.check_n_at(at(9), u32::MAX).is_ok());
    // An earlier time gets the latest permit time, not its own.
    assert_eq!(l.take_at(at(1)), at(9));
}

#[test]
fn sleep_until_returns_at_the_deadline_not_before() {
    let clock = turnstile::QuantaClock::new();
    for wait_us in [0u64, 50, 300, 2_000] {
        let deadline = clock.now() + Duration::from_micros(wait_us);
        turnstile::clock::sleep_until(&clock, deadline);
        let now = clock.now();
        assert!(now >= deadline);
    }
    // A deadline in the past returns at once (a minute's bound tells that from a sleep towards
    // a wrapped-around deadline, centuries away, on any loaded machine).
    let start = Instant::now();
    turnstile::clock::sleep_until(&clock, Nanos::ZERO);
    assert!(start.elapsed() < Duration::from_secs(60));
}

#[test]
fn sleep_until_on_a_stopped_manual_clock_is_bounded_by_the_wait_it_showed() {
    let clock = ManualClock::new(at(SEC));
    let start = Instant::now();
    turnstile::clock::sleep_until(&clock, at(SEC + 3 * MS));
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(3), "{took:?}");
    // Not for ever (the stopped clock never reaches the deadline): a minute is far from both.
    assert!(took < Duration::from_secs(60), "{took:?}");
    assert_eq!(clock.now(), at(SEC));
}

#[test]
fn debug_shows_the_configuration() {
    let l = lb(10, 2);
    let s = format!("{l:?}");
    assert!(s.contains("rate: 10") && s.contains("slack: 2") && s.contains("next: None"));
    l.take_at(at(7));
    assert!(format!("{l:?}").contains("next: Some(7ns)"));
    assert_eq!(
        format!("{:?}", LeakyBucket::unlimited()),
        "LeakyBucket(unlimited)"
    );
}

/// `Idle`: idle before the first permit (identical to a fresh bucket) and once the slack
/// credit is full, `now - next > maxSlack + perRequest` (a fresh bucket is then stricter);
/// an unlimited bucket always.
#[test]
fn idle_before_the_first_permit_and_once_the_slack_is_full() {
    use turnstile::Idle;
    let build = || {
        LeakyBucket::builder(10)
            .slack(2)
            .clock(ManualClock::default())
            .build()
            .unwrap()
    };
    let lb = build();
    assert!(lb.is_idle_at(at(0)));
    assert!(lb.is_idle_at(at(T0)));
    assert_eq!(lb.take_at(at(T0)), at(T0)); // next = T0
    assert!(!lb.is_idle_at(at(T0)));
    // (slack + 1) * 100 ms = 300 ms: at exactly 300 ms the default branch still runs.
    assert!(!lb.is_idle_at(at(T0 + 300 * MS)));
    assert!(lb.is_idle_at(at(T0 + 300 * MS + 1)));
    assert!(!lb.is_idle_at(at(T0 - SEC))); // before `next`

    // Idle at t: a fresh bucket grants no more than this one, from t on.
    let t = T0 + 300 * MS + 1;
    let fresh = build();
    let (mut ours, mut theirs) = (0, 0);
    for i in 0..100u64 {
        let now = at(t + (i * 7919) % 13 * 20 * MS * (i / 10));
        ours += u32::from(lb.check_n_at(now, 1 + (i % 2) as u32).is_ok());
        theirs += u32::from(fresh.check_n_at(now, 1 + (i % 2) as u32).is_ok());
    }
    assert!(theirs <= ours, "fresh {theirs} > idle {ours}");
    // Strictly stricter: the idle bucket has banked slack, the fresh one has none.
    let lb = build();
    lb.take_at(at(T0));
    let fresh = build();
    assert!(lb.check_n_at(at(t), 3).is_ok());
    assert!(fresh.check_n_at(at(t), 3).is_err());
    // Unlimited: always idle.
    let u = LeakyBucket::unlimited();
    assert!(u.is_idle_at(at(0)));
    assert!(u.try_take());
    assert!(u.is_idle_at(at(0)));
}
