//! `turnstile::redis::MultiGcra` against a real redis-server of each test's own: all or
//! nothing over the limits (a refusal by one takes nothing from the others, and writes
//! nothing), which limit refuses and the exact retry time, weighted checks, the one key per
//! client and its TTL, bad input refused before any round trip (and at build, as typed
//! `ConfigError`s), decisions equal to the in-process `MultiTokenBucket`'s on sequences of
//! checks, a forced `Coalesce` batch, and a limit shared by four clients.
//!
//! As in `gcra.rs`, answers that depend on time use slow limits (per minute, hour or day), so
//! the real time between two calls (well under a second) changes no count; durations are
//! checked by exact relations between fields of one reply, or within a second of the figure.
//! `Fallback<MultiGcra>` is in `fallback_limiters.rs`, its faults in `faults.rs`.
#![cfg(feature = "redis")]

use crate::common;
use crate::gcra::Counting;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::redis_server::RedisServer;
use common::redis_shared::{self, patient, patient_connection};
use turnstile::multi_token_bucket::{Bandwidth, MultiTokenBucket};
use turnstile::redis::{
    multi_gcra::decode_tats, Coalesce, ConnectionManager, MultiGcra, MultiThrottle, RedisBatch,
    RedisLimitError, RedisLimiter, StatusVerdict,
};
use turnstile::{ConfigError, Limit, ManualClock, Nanos, QuotaStatus};

const MINUTE: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(86_400);

async fn connect(s: &RedisServer) -> ConnectionManager {
    let client = redis::Client::open(s.url()).expect("client");
    ConnectionManager::new(client).await.expect("connect")
}

/// How many `SET`s the server has run (the script's writes included).
fn sets(s: &RedisServer) -> u64 {
    s.cli(&["info", "commandstats"])
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_set:calls="))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

/// `d` is within a second below `expected` (the real time spent between calls).
fn about(d: Duration, expected: Duration) -> bool {
    d <= expected && d > expected.saturating_sub(Duration::from_secs(1))
}

fn remaining(t: &MultiThrottle) -> Vec<u64> {
    t.statuses().iter().map(|s| s.remaining).collect()
}

/// The server's `TIME` in µs.
fn server_now_us(s: &RedisServer) -> u128 {
    let t: Vec<u128> = s
        .cli(&["time"])
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    t[0] * 1_000_000 + t[1]
}

/// The key's arrival times in units (10⁻¹⁸ s) since the epoch, read as the module docs say
/// the key holds them.
async fn tats_units(con: &ConnectionManager, key: &str) -> Vec<u128> {
    let value: Vec<u8> = redis::cmd("GET")
        .arg(key)
        .query_async(&mut con.clone())
        .await
        .unwrap();
    decode_tats(&value)
        .expect("16 bytes a limit")
        .into_iter()
        .map(|(us, units)| u128::from(us) * 1_000_000_000_000 + u128::from(units))
        .collect()
}

/// The same in whole µs.
async fn tats_us(con: &ConnectionManager, key: &str) -> Vec<u128> {
    let units = tats_units(con, key).await;
    units.into_iter().map(|t| t / 1_000_000_000_000).collect()
}

/// Grants add exactly `n × T_i` to every limit's time, where no `T_i` is a whole number of µs
/// (7 per minute: 8.571428571428571428... s; 11 per hour: 327.272727... s): the units carry
/// into the µs on the server, so nothing drifts.
#[tokio::test]
async fn grants_add_exactly_n_times_t_to_every_limit() {
    let Some(s) = RedisServer::start("grants_add_exactly_n_times_t_to_every_limit") else {
        return;
    };
    let con = connect(&s).await;
    let m = MultiGcra::builder(&[
        Bandwidth::per(7, MINUTE).burst_of(100_000),
        Bandwidth::per(11, HOUR).burst_of(100_000),
    ])
    .build(con.clone())
    .unwrap();
    let key = "turnstile:multi_gcra:exact";
    assert!(m.throttle("exact", 1).await.unwrap().allowed);
    let first = tats_units(&con, key).await;
    let mut total = 0u128;
    for n in [1, 1, 1, 600, 7, 3_333, 59] {
        assert!(m.throttle("exact", n).await.unwrap().allowed);
        total += u128::from(n);
    }
    let now = tats_units(&con, key).await;
    // (seconds, permits) of each limit, so T_i = seconds / permits.
    for (i, (seconds, permits)) in [(60, 7), (3_600, 11)].into_iter().enumerate() {
        let exact = total * seconds * 1_000_000_000_000_000_000 / permits;
        let grown = now[i] - first[i];
        assert!(
            grown.abs_diff(exact) < exact / 1_000_000_000_000,
            "limit {i}: grew {grown} units for {total} permits; exact {exact}"
        );
    }
}

/// A refusal by the daily limit takes nothing from the per-minute one and writes nothing at
/// all; a refusal by the per-minute limit takes nothing from the daily one.
#[tokio::test]
async fn a_refusal_by_one_limit_takes_nothing_from_the_others() {
    let Some(s) = RedisServer::start("a_refusal_by_one_limit_takes_nothing_from_the_others") else {
        return;
    };
    let m = MultiGcra::new(
        connect(&s).await,
        &[
            Bandwidth::per(10, MINUTE),
            Bandwidth::per(3, DAY), // the daily budget runs out first
        ],
    )
    .unwrap();
    let t = m.throttle("a", 3).await.unwrap();
    assert!(
        t.allowed && t.refused_by.is_none() && t.retry_after.is_none(),
        "{t:?}"
    );
    assert_eq!(remaining(&t), [7, 0]);
    let key = "turnstile:multi_gcra:a";
    let value = s.cli(&["get", key]);
    let sets_before = sets(&s);
    for n in [1, 2, 3, 1] {
        let t = m.throttle("a", n).await.unwrap();
        assert!(!t.allowed, "{t:?}");
        assert_eq!(t.refused_by, Some(1), "the daily limit refused: {t:?}");
        assert_eq!(remaining(&t), [7, 0], "nothing taken from either: {t:?}");
        assert!(m.try_check_n("a", n).await.unwrap().is_err());
    }
    assert_eq!(
        s.cli(&["get", key]),
        value,
        "the arrival times are unchanged"
    );
    assert_eq!(sets(&s), sets_before, "no write at all");
    assert_eq!(remaining(&m.peek("a").await.unwrap()), [7, 0]);

    // The other way round: the per-minute limit refuses, the daily one keeps its permits.
    let m = MultiGcra::builder(&[Bandwidth::per(2, MINUTE), Bandwidth::per(50, DAY)])
        .prefix("b:")
        .build(connect(&s).await)
        .unwrap();
    assert!(m.throttle("b", 2).await.unwrap().allowed);
    for _ in 0..5 {
        let t = m.throttle("b", 1).await.unwrap();
        assert_eq!((t.allowed, t.refused_by), (false, Some(0)), "{t:?}");
        assert_eq!(remaining(&t), [0, 48]);
    }
    assert_eq!(remaining(&m.peek("b").await.unwrap()), [0, 48]);
}

/// The limit named is the one admitting last, and the retry time is exactly when it admits:
/// exact relations between the fields of one reply (both come from the same `d_i`).
#[tokio::test]
async fn the_refusal_names_the_limit_admitting_last_with_its_exact_retry() {
    let Some(s) =
        RedisServer::start("the_refusal_names_the_limit_admitting_last_with_its_exact_retry")
    else {
        return;
    };
    // T = 60 s, tau = 180 s; T = 6 h, tau = 1 day.
    let m = MultiGcra::new(
        connect(&s).await,
        &[Bandwidth::per(3, 3 * MINUTE), Bandwidth::per(4, DAY)],
    )
    .unwrap();
    let t = m.throttle("r", 3).await.unwrap();
    assert!(t.allowed);
    // From full buckets, exactly: each reset is 3 × T_i, the key's is the longest.
    assert_eq!(t.statuses()[0].reset, 3 * MINUTE);
    assert_eq!(t.statuses()[1].reset, 18 * HOUR);
    assert_eq!(t.reset_after, 18 * HOUR);

    // One more: the per-minute limit is full (60 s to go), the daily one has a permit.
    let t = m.throttle("r", 1).await.unwrap();
    assert_eq!((t.allowed, t.refused_by), (false, Some(0)), "{t:?}");
    let retry = t.retry_after.unwrap();
    assert!(about(retry, MINUTE), "{t:?}");
    // retry = d_0 + T_0 - tau_0 and reset_0 = d_0: they differ by tau_0 - T_0, exactly.
    assert_eq!(t.statuses()[0].reset - retry, 2 * MINUTE, "{t:?}");
    assert_eq!(remaining(&t), [0, 1]);
    assert_eq!(t.reset_after, t.statuses()[1].reset);

    // Two: the per-minute limit admits them in 2 minutes, the daily one in 6 hours.
    let t = m.throttle("r", 2).await.unwrap();
    assert_eq!((t.allowed, t.refused_by), (false, Some(1)), "{t:?}");
    let retry = t.retry_after.unwrap();
    assert!(about(retry, 6 * HOUR), "{t:?}");
    // retry = d_1 + 2 T_1 - tau_1, reset_1 = d_1: 12 hours apart, exactly.
    assert_eq!(t.statuses()[1].reset - retry, 12 * HOUR, "{t:?}");
    // The crate-wide shape carries the same retry.
    let denied = m.try_check_n("r", 2).await.unwrap().unwrap_err();
    assert!(about(denied.retry_after().unwrap(), 6 * HOUR), "{denied:?}");

    // Two limits over by exactly as much: the last one given is named, as in process.
    let twins = MultiGcra::builder(&[Bandwidth::per(2, MINUTE), Bandwidth::per(2, MINUTE)])
        .prefix("twins:")
        .build(connect(&s).await)
        .unwrap();
    assert!(twins.throttle("t", 2).await.unwrap().allowed);
    let t = twins.throttle("t", 1).await.unwrap();
    assert_eq!(t.refused_by, Some(1), "{t:?}");
    let clock = ManualClock::default();
    let mtb = MultiTokenBucket::builder(&[Bandwidth::per(2, MINUTE), Bandwidth::per(2, MINUTE)])
        .clock(clock)
        .build()
        .unwrap();
    mtb.check_n_at(Nanos::ZERO, 2).unwrap();
    assert_eq!(mtb.check_at(Nanos::ZERO).unwrap_err().limit(), 1);
}

/// Checks of n permits take n from every limit; more than the smallest burst is bad input.
#[tokio::test]
async fn weighted_checks_take_n_from_every_limit() {
    let Some(s) = RedisServer::start("weighted_checks_take_n_from_every_limit") else {
        return;
    };
    let m = MultiGcra::new(
        connect(&s).await,
        &[
            Bandwidth::per(10, MINUTE),
            Bandwidth::per(6, DAY),
            Bandwidth::per(100, HOUR).burst_of(8),
        ],
    )
    .unwrap();
    let t = m.throttle("w", 4).await.unwrap();
    assert!(t.allowed);
    assert_eq!(remaining(&t), [6, 2, 4]);
    // 3 more: the daily limit has 2; it admits the 3 in 4 hours (one permit), less the
    // time spent.
    let t = m.throttle("w", 3).await.unwrap();
    assert_eq!((t.allowed, t.refused_by), (false, Some(1)), "{t:?}");
    assert!(about(t.retry_after.unwrap(), 4 * HOUR), "{t:?}");
    assert_eq!(remaining(&t), [6, 2, 4]);
    let t = m.throttle("w", 2).await.unwrap();
    assert!(t.allowed, "{t:?}");
    assert_eq!(remaining(&t), [4, 0, 2]);
    // n = 7 > the smallest burst (6): never, refused before any round trip.
    assert!(matches!(
        m.throttle("w", 7).await,
        Err(RedisLimitError::ExceedsBurst { n: 7, burst: 6 })
    ));
    assert!(matches!(
        m.try_check_n("w", 7).await,
        Err(RedisLimitError::ExceedsBurst { n: 7, burst: 6 })
    ));
    // A batch decides each request as if alone, in order: after a refusal a smaller one passes.
    let ts = m.throttle_batch("x", &[5, 2, 1, 0]).await.unwrap();
    let allowed: Vec<bool> = ts.iter().map(|t| t.allowed).collect();
    assert_eq!(allowed, [true, false, true, true]);
    assert_eq!(ts[1].refused_by, Some(1));
    assert_eq!(remaining(&ts[3]), [4, 0, 2]);
}

/// One key per client, holding every limit's arrival time; its TTL is until every limit is
/// full again (the longest of them), and it is gone then.
#[tokio::test]
async fn one_key_whose_ttl_is_until_every_limit_is_full() {
    let Some(s) = RedisServer::start("one_key_whose_ttl_is_until_every_limit_is_full") else {
        return;
    };
    let con = connect(&s).await;
    // A fast first limit (50/s, burst 1: full 20 ms after a permit) and a slow second one.
    let m = MultiGcra::new(
        con.clone(),
        &[
            Bandwidth::new(Limit::per_second(50.0).unwrap(), 1),
            Bandwidth::per(5, MINUTE),
        ],
    )
    .unwrap();
    let before = server_now_us(&s);
    let t = m.throttle("e", 1).await.unwrap();
    assert!(t.allowed);
    assert_eq!(
        t.reset_after,
        Duration::from_secs(12),
        "one T of the slow limit"
    );
    let key = "turnstile:multi_gcra:e";
    assert_eq!(s.cli(&["type", key]), "string");
    let pttl: u128 = s.cli(&["pttl", key]).parse().unwrap();
    assert!(
        pttl <= 12_000 && pttl > 11_000,
        "the slow limit's reset: {pttl} ms"
    );
    // The two arrival times: 20 ms and 12 s past the check's `now`.
    let tats = tats_us(&con, key).await;
    assert_eq!(tats.len(), 2, "{tats:?}");
    assert_eq!(tats[1] - tats[0], 12_000_000 - 20_000);
    assert!(
        tats[0] >= before + 20_000 && tats[0] < before + 1_020_000,
        "{tats:?}"
    );

    // Both fast: the key lives 20 ms (at least 1 ms), then reads as full buckets.
    let fast = MultiGcra::builder(&[
        Bandwidth::new(Limit::per_second(50.0).unwrap(), 1),
        Bandwidth::new(Limit::per_second(100.0).unwrap(), 2),
    ])
    .prefix("f:")
    .build(con)
    .unwrap();
    let t = fast.throttle("f", 1).await.unwrap();
    assert!(
        t.allowed && t.reset_after <= Duration::from_millis(20),
        "{t:?}"
    );
    let pttl: i64 = s.cli(&["pttl", "f:f"]).parse().unwrap();
    assert!((0..=20).contains(&pttl) || pttl == -2, "pttl {pttl}");
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(s.cli(&["exists", "f:f"]), "0", "expired");
    let t = fast.peek("f").await.unwrap();
    assert_eq!(remaining(&t), [1, 2]);
    assert_eq!(t.reset_after, Duration::ZERO);
}

/// The statuses of one reply, exactly, from full buckets; the status verdict is the binding
/// limit's; a peek writes nothing.
#[tokio::test]
async fn statuses_of_a_check_and_the_binding_one() {
    let Some(s) = RedisServer::start("statuses_of_a_check_and_the_binding_one") else {
        return;
    };
    let m = MultiGcra::new(
        connect(&s).await,
        &[Bandwidth::per(10, MINUTE), Bandwidth::per(4, HOUR)],
    )
    .unwrap();
    let full = m.peek("p").await.unwrap();
    assert!(full.allowed && full.reset_after.is_zero());
    assert_eq!(
        s.cli(&["exists", "turnstile:multi_gcra:p"]),
        "0",
        "a peek writes nothing"
    );
    let answer = m.try_check_n_status("st", 2).await.unwrap();
    let hourly = QuotaStatus {
        quota: 4,
        window: HOUR,
        remaining: 2,
        reset: 30 * MINUTE,
    };
    assert_eq!(
        answer,
        StatusVerdict {
            result: Ok(()),
            status: Some(hourly),
        },
        "the hourly limit binds (2 left of 4, against 8 of 10)"
    );
    let t = m.peek("st").await.unwrap();
    assert_eq!(t.statuses().len(), 2);
    assert_eq!(
        (t.statuses()[0].quota, t.statuses()[0].window),
        (10, MINUTE)
    );
    assert_eq!(t.statuses()[0].remaining, 8);
    assert_eq!(t.binding(), t.statuses()[1]);
    // A refusal's status: the permits as they were.
    let answer = m.try_check_n_status("st", 3).await.unwrap();
    assert!(answer.result.is_err());
    assert_eq!(answer.status.unwrap().remaining, 2);
}

#[test]
fn bad_configurations_are_typed_errors() {
    let con = Counting::default();
    let sent = con.0.clone();
    let ok = Bandwidth::per(10, MINUTE);
    assert_eq!(
        MultiGcra::new(con.clone(), &[]).unwrap_err(),
        ConfigError::LimitCount(0)
    );
    assert_eq!(
        MultiGcra::new(con.clone(), &[ok; 5]).unwrap_err(),
        ConfigError::LimitCount(5)
    );
    let out_of_range = |limits: &[Bandwidth]| match MultiGcra::builder(limits).build(con.clone()) {
        Err(ConfigError::LimitOutOfRange { index, .. }) => index,
        other => panic!("{limits:?}: {other:?}"),
    };
    assert_eq!(
        out_of_range(&[ok, Bandwidth::new(Limit::ZERO, 5)]),
        1,
        "zero rate"
    );
    assert_eq!(out_of_range(&[ok, Bandwidth::per(0, DAY)]), 1, "zero quota");
    assert_eq!(out_of_range(&[ok.burst_of(0), ok]), 0, "zero burst");
    assert_eq!(
        out_of_range(&[Bandwidth::new(Limit::INF, 5)]),
        0,
        "no infinite rate"
    );
    // Four is the most.
    assert!(MultiGcra::new(con.clone(), &[ok; 4]).is_ok());
    assert_eq!(sent.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn bad_input_is_refused_before_any_round_trip() {
    let con = Counting::default();
    let sent = con.0.clone();
    let m = MultiGcra::builder(&[Bandwidth::per(10, MINUTE), Bandwidth::per(5, DAY)])
        .max_key_len(8)
        .build(con)
        .unwrap();
    assert_eq!(m.max_key_len(), 8);
    assert!(matches!(
        m.throttle("", 1).await,
        Err(RedisLimitError::EmptyKey)
    ));
    assert!(matches!(m.peek("").await, Err(RedisLimitError::EmptyKey)));
    assert!(matches!(
        m.try_check_n("123456789", 1).await,
        Err(RedisLimitError::KeyTooLong { len: 9, max: 8 })
    ));
    assert!(matches!(
        m.throttle("k", 6).await,
        Err(RedisLimitError::ExceedsBurst { n: 6, burst: 5 })
    ));
    assert!(matches!(
        m.throttle_batch("k", &[1, u32::MAX]).await,
        Err(RedisLimitError::ExceedsBurst { .. })
    ));
    assert!(matches!(
        RedisBatch::validate(&m, "k", 6),
        Err(RedisLimitError::ExceedsBurst { n: 6, burst: 5 })
    ));
    assert_eq!(sent.load(Ordering::SeqCst), 0, "nothing was sent");
    let err = m.throttle("12345678", 5).await.unwrap_err();
    assert!(err.is_outage(), "{err:?}");
    assert!(sent.load(Ordering::SeqCst) > 0);
}

/// A key holding something else: a script error, a misconfiguration (never a panic or a
/// silent reset); a key of fewer limits reads the missing ones as full.
#[tokio::test]
async fn foreign_keys_are_misconfigurations_or_read_by_position() {
    let Some(s) = RedisServer::start("foreign_keys_are_misconfigurations_or_read_by_position")
    else {
        return;
    };
    let con = connect(&s).await;
    let two = MultiGcra::new(
        con.clone(),
        &[Bandwidth::per(4, MINUTE), Bandwidth::per(10, DAY)],
    )
    .unwrap();
    for junk in [
        "hello",
        "12.5 x",
        "",
        "aaaaaaaaaaaaaaaa",
        "1764559341123456.000000500000",
    ] {
        s.cli(&["set", "turnstile:multi_gcra:j", junk]);
        let e = two.throttle("j", 1).await.unwrap_err();
        assert!(e.is_misconfiguration(), "{junk:?}: {e:?}");
    }
    s.cli(&["del", "turnstile:multi_gcra:j"]);
    s.cli(&["hset", "turnstile:multi_gcra:j", "f", "v"]);
    assert!(two
        .throttle("j", 1)
        .await
        .unwrap_err()
        .is_misconfiguration());

    // A deploy that adds a third limit: the first two keep what they had, the third is full.
    assert!(two.throttle("d", 3).await.unwrap().allowed);
    let three = MultiGcra::new(
        con.clone(),
        &[
            Bandwidth::per(4, MINUTE),
            Bandwidth::per(10, DAY),
            Bandwidth::per(6, HOUR),
        ],
    )
    .unwrap();
    let t = three.throttle("d", 1).await.unwrap();
    assert_eq!(remaining(&t), [0, 6, 5]);
    assert_eq!(tats_us(&con, "turnstile:multi_gcra:d").await.len(), 3);
    // And back to one: the others are dropped at the next grant.
    let one = MultiGcra::new(con, &[Bandwidth::per(4, MINUTE)]).unwrap();
    let t = one.peek("d").await.unwrap();
    assert_eq!(remaining(&t), [0]);
}

#[test]
fn the_local_fallback_has_the_scaled_limits() {
    let m = MultiGcra::new(
        Counting::default(),
        &[
            Bandwidth::new(Limit::per_second(100.0).unwrap(), 10),
            Bandwidth::per(1000, DAY),
        ],
    )
    .unwrap();
    let l = m.local(0.25);
    let limits = l.limits();
    assert_eq!(limits[0].limit().as_f64(), 25.0);
    assert_eq!(limits[0].burst(), 3); // ceil(2.5)
    assert_eq!(limits[1].burst(), 250);
    assert!((limits[1].limit().as_f64() - 250.0 / 86_400.0).abs() < 1e-12);
    assert!(l.check_n(3).is_ok() && l.check().is_err());
    let l = m.local(0.0001);
    assert_eq!((l.limits()[0].burst(), l.limits()[1].burst()), (1, 1));
    assert_eq!(m.local(1.0).limits(), m.limits());
    assert_eq!(m.local(f64::NAN).limits(), m.limits());
}

/// The decisions of `MultiGcra` and the in-process `MultiTokenBucket` on the same sequences
/// of checks: whether each passes, which limit refuses, every limit's whole permits left, and
/// the retry time within a second. The server's clock runs on while the in-process one stands
/// at 0; the limits refill at most a permit an hour, so the real time a sequence takes
/// (a second or so) changes no decision.
#[tokio::test]
async fn decisions_equal_the_in_process_multi_token_bucket() {
    let Some(s) = RedisServer::start("decisions_equal_the_in_process_multi_token_bucket") else {
        return;
    };
    let con = connect(&s).await;
    let configs: [&[Bandwidth]; 5] = [
        &[Bandwidth::per(7, HOUR)],
        &[Bandwidth::per(12, HOUR), Bandwidth::per(10, DAY)],
        &[
            Bandwidth::per(20, HOUR).burst_of(9),
            Bandwidth::per(25, DAY),
        ],
        &[
            Bandwidth::per(6, HOUR),
            Bandwidth::per(14, DAY),
            Bandwidth::per(6, HOUR),
        ],
        &[
            Bandwidth::per(9, HOUR),
            Bandwidth::per(40, DAY),
            Bandwidth::per(15, 2 * HOUR),
            Bandwidth::per(100, 7 * DAY).burst_of(8),
        ],
    ];
    let mut rng = common::rng_seed(23);
    let (mut refusals, mut by) = (0, [0u32; 4]);
    for (c, limits) in configs.iter().enumerate() {
        let m = MultiGcra::builder(limits)
            .prefix(format!("diff{c}:"))
            .build(con.clone())
            .unwrap();
        let min_burst = limits.iter().map(|b| b.burst()).min().unwrap();
        for key in 0..3 {
            let key = format!("k{key}");
            let mtb = MultiTokenBucket::builder(limits)
                .clock(ManualClock::default())
                .build()
                .unwrap();
            for step in 0..40 {
                let n = (common::xorshift(&mut rng) % u64::from(min_burst.min(5) + 1)) as u32;
                let t = m.throttle(&key, n).await.unwrap();
                let local = mtb.check_n_at(Nanos::ZERO, n);
                let at = format!("config {c} key {key} step {step} n {n}: {t:?} vs {local:?}");
                assert_eq!(t.allowed, local.is_ok(), "{at}");
                if let Err(d) = local {
                    refusals += 1;
                    by[d.limit()] += 1;
                    assert_eq!(t.refused_by, Some(d.limit()), "{at}");
                    let (r, l) = (t.retry_after.unwrap(), d.retry_after().unwrap());
                    assert!(r <= l && l - r < Duration::from_secs(1), "{at}");
                }
                let st = mtb.status_at(Nanos::ZERO);
                let local_left: Vec<u64> = st.iter().map(|s| s.remaining).collect();
                assert_eq!(remaining(&t), local_left, "{at}");
                assert_eq!(t.binding().remaining, st.binding().remaining, "{at}");
            }
        }
    }
    // The sequences reached refusals by every limit position, not only the first.
    assert!(refusals > 50, "{refusals}");
    assert!(by.iter().all(|&b| b > 0), "{by:?}");
}

/// A batch forced by stopping the server behind the first check decides exactly what the same
/// checks decide one by one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_coalesced_batch_decides_what_the_checks_decide_one_by_one() {
    let Some(s) =
        RedisServer::start("a_forced_coalesced_batch_decides_what_the_checks_decide_one_by_one")
    else {
        return;
    };
    let con = turnstile::redis::connect_with(&s.url(), &patient_connection())
        .await
        .unwrap();
    let limits = [Bandwidth::per(60, HOUR), Bandwidth::per(41, DAY)];
    let m = MultiGcra::new(con, &limits).unwrap();
    m.peek("warm-up").await.unwrap();
    let c: Arc<Coalesce<MultiGcra>> = Arc::new(patient(m));
    let ns: Vec<u32> = (0..40).map(|i| [3, 1, 2, 4, 1][i % 5]).collect();
    let until = |what: &'static str, f: fn(&Coalesce<MultiGcra>) -> u64, n: u64| {
        let c = c.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(20);
            while f(&c) != n {
                assert!(
                    Instant::now() < deadline,
                    "{:?}, waiting for {n} {what}",
                    c.stats()
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    };
    s.pause();
    let mut tasks = Vec::new();
    for (i, &n) in ns.iter().enumerate() {
        let c2 = c.clone();
        tasks.push(tokio::spawn(
            async move { c2.try_check_n("batched", n).await },
        ));
        if i == 0 {
            until("calls", |c| c.stats().calls, 1).await;
        } else {
            until("queued", |c| c.stats().queued, i as u64).await;
        }
    }
    s.resume();
    let mut batched = Vec::new();
    for t in tasks {
        let v = tokio::time::timeout(Duration::from_secs(20), t)
            .await
            .expect("answered")
            .unwrap()
            .expect("no infrastructure error");
        batched.push(v.is_ok());
    }
    assert_eq!(
        (c.stats().checks, c.stats().calls),
        (40, 2),
        "{:?}",
        c.stats()
    );
    let m = c.limiter();
    let mut alone = Vec::new();
    for &n in &ns {
        alone.push(m.throttle("alone", n).await.unwrap().allowed);
    }
    assert_eq!(batched, alone);
    assert!(alone.windows(2).any(|w| !w[0] && w[1]), "{alone:?}");
    let left = |t: MultiThrottle| remaining(&t);
    assert_eq!(
        left(m.peek("batched").await.unwrap()),
        left(m.peek("alone").await.unwrap())
    );
    assert_eq!(
        left(m.peek("alone").await.unwrap())[1],
        0,
        "the daily limit ran out"
    );
}

/// Four clients, each its own connection, thread and runtime, 2 tasks each, on one key for
/// about 2 s: 500/s with bursts of 50 and 300/s with bursts of 100. The second binds after a
/// quarter of a second: the permits granted stay within its `burst + rate × elapsed + n` and
/// reach 98 % of it.
#[test]
fn two_limits_shared_by_four_clients() {
    let Some(s) = RedisServer::start("two_limits_shared_by_four_clients") else {
        return;
    };
    let run = redis_shared::run(&s.url(), "shared", Duration::from_secs(2), 4, 2, |con| {
        MultiGcra::new(
            con,
            &[
                Bandwidth::new(Limit::per_second(500.0).unwrap(), 50),
                Bandwidth::new(Limit::per_second(300.0).unwrap(), 100),
            ],
        )
        .unwrap()
    });
    redis_shared::assert_within_the_limit(&run, 300.0, 100);
}
