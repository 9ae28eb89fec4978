//! `turnstile::redis::Gcra` against a real redis-server of each test's own: the GCRA
//! semantics with `CL.THROTTLE`'s answers (burst, denial, peek, n permits, a denial writing
//! nothing, expiry), the script's transparent reload after `SCRIPT FLUSH`, a limit shared by
//! four clients, and bad input refused before any round trip.
//!
//! Answers that depend on time use a slow limit (1 per minute), so the real time between two
//! calls (well under a second) cannot change a count; durations are checked by exact
//! relations between fields of one reply, or within a second of the figure.
#![cfg(feature = "redis")]

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::redis_server::RedisServer;
use common::redis_shared;
use redis::aio::ConnectionLike;
use turnstile::redis::{
    ConnectionManager, Gcra, RedisLimitError, RedisLimiter, StatusVerdict, Throttle,
};
use turnstile::{ConfigError, Limit, Limiter, QuotaStatus};

const MINUTE: Duration = Duration::from_secs(60);

fn per_minute() -> Limit {
    Limit::every(MINUTE)
}

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

#[tokio::test]
async fn a_burst_then_denial_with_exact_answers() {
    let Some(s) = RedisServer::start("a_burst_then_denial_with_exact_answers") else {
        return;
    };
    let g = Gcra::new(connect(&s).await, per_minute(), 3).unwrap();
    for (i, left) in [2, 1, 0].into_iter().enumerate() {
        let t = g.throttle("burst", 1).await.unwrap();
        assert!(t.allowed, "call {i}: {t:?}");
        assert_eq!((t.limit, t.remaining, t.retry_after), (3, left, None));
        // Full again after (i + 1) minutes, less the time already spent.
        assert!(about(t.reset_after, MINUTE * (i as u32 + 1)), "{t:?}");
    }
    let t = g.throttle("burst", 1).await.unwrap();
    assert!(!t.allowed, "{t:?}");
    assert_eq!((t.limit, t.remaining), (3, 0));
    let retry = t.retry_after.expect("a retry time");
    assert!(about(retry, MINUTE), "{t:?}");
    // Exactly: reset = d, retry = d + T - tau, so reset - retry = tau - T = 2 minutes.
    assert_eq!(t.reset_after - retry, 2 * MINUTE, "{t:?}");
    // The crate-wide shape says the same.
    let denied = g.try_check_n("burst", 1).await.unwrap().unwrap_err();
    let r = denied.retry_after().unwrap();
    assert!(
        r <= retry && r + Duration::from_secs(1) > retry,
        "{r:?} vs {retry:?}"
    );
    assert_eq!(denied.retry_after_secs(), Some(60));
    // Other keys are other limits.
    assert_eq!(g.throttle("other", 3).await.unwrap().remaining, 0);
    // The key holds the TAT, µs with twelve decimals, about 3 minutes ahead of the server.
    let tat = s.cli(&["get", "turnstile:gcra:burst"]);
    let (us, frac) = tat.split_once('.').expect("µs.units");
    assert_eq!(frac, "000000000000", "{tat}");
    let server_now: Vec<u64> = s
        .cli(&["time"])
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    let now_us = server_now[0] * 1_000_000 + server_now[1];
    let ahead = us.parse::<u64>().unwrap() - now_us;
    assert!(
        ahead <= 180_000_000 && ahead > 179_000_000,
        "{tat} at {now_us}"
    );
}

#[tokio::test]
async fn a_peek_takes_nothing() {
    let Some(s) = RedisServer::start("a_peek_takes_nothing") else {
        return;
    };
    let g = Gcra::builder(per_minute(), 4)
        .prefix("p:")
        .build(connect(&s).await)
        .unwrap();
    let full: Throttle = g.peek("k").await.unwrap();
    assert!(full.allowed);
    assert_eq!((full.limit, full.remaining, full.retry_after), (4, 4, None));
    assert_eq!(full.reset_after, Duration::ZERO);
    assert_eq!(s.cli(&["exists", "p:k"]), "0", "a peek creates no key");
    assert_eq!(g.throttle("k", 1).await.unwrap().remaining, 3);
    let tat = s.cli(&["get", "p:k"]);
    let sets_before = sets(&s);
    assert!(sets_before > 0);
    for _ in 0..5 {
        let t = g.peek("k").await.unwrap();
        assert!(t.allowed && t.retry_after.is_none(), "{t:?}");
        assert_eq!(t.remaining, 3);
        assert!(about(t.reset_after, MINUTE), "{t:?}");
        assert_eq!(g.throttle("k", 0).await.unwrap().remaining, 3);
        assert_eq!(g.try_check_n("k", 0).await.unwrap(), Ok(()));
    }
    assert_eq!(s.cli(&["get", "p:k"]), tat, "peeks write nothing");
    assert_eq!(sets(&s), sets_before, "peeks write nothing");
    assert_eq!(g.throttle("k", 3).await.unwrap().remaining, 0);
    assert_eq!(g.peek("k").await.unwrap().remaining, 0);
}

#[tokio::test]
async fn n_permits_at_once() {
    let Some(s) = RedisServer::start("n_permits_at_once") else {
        return;
    };
    let g = Gcra::new(connect(&s).await, per_minute(), 5).unwrap();
    let t = g.throttle("n", 3).await.unwrap();
    assert!(t.allowed && t.remaining == 2, "{t:?}");
    assert!(about(t.reset_after, 3 * MINUTE), "{t:?}");
    let t = g.throttle("n", 3).await.unwrap();
    assert!(!t.allowed && t.remaining == 2, "{t:?}");
    // One permit short: it arrives in a minute (less the time spent).
    assert!(about(t.retry_after.unwrap(), MINUTE), "{t:?}");
    assert_eq!(t.reset_after - t.retry_after.unwrap(), 2 * MINUTE);
    let t = g.throttle("n", 2).await.unwrap();
    assert!(t.allowed && t.remaining == 0, "{t:?}");
    assert!(about(t.reset_after, 5 * MINUTE), "{t:?}");
    let t = g.throttle("n", 5).await.unwrap();
    assert!(!t.allowed, "{t:?}");
    assert_eq!(t.reset_after - t.retry_after.unwrap(), Duration::ZERO);
    assert!(g.try_check_n("n", 1).await.unwrap().is_err());
}

#[tokio::test]
async fn a_denial_writes_nothing() {
    let Some(s) = RedisServer::start("a_denial_writes_nothing") else {
        return;
    };
    let g = Gcra::new(connect(&s).await, per_minute(), 2).unwrap();
    assert!(g.throttle("d", 2).await.unwrap().allowed);
    let tat = s.cli(&["get", "turnstile:gcra:d"]);
    let pttl: i64 = s.cli(&["pttl", "turnstile:gcra:d"]).parse().unwrap();
    let sets_before = sets(&s);
    for n in [1, 2, 1, 1] {
        let t = g.throttle("d", n).await.unwrap();
        assert!(!t.allowed, "{t:?}");
        assert!(g.try_check_n("d", n).await.unwrap().is_err());
    }
    assert_eq!(
        s.cli(&["get", "turnstile:gcra:d"]),
        tat,
        "the TAT is unchanged"
    );
    assert_eq!(sets(&s), sets_before, "no write at all");
    let after: i64 = s.cli(&["pttl", "turnstile:gcra:d"]).parse().unwrap();
    assert!(
        after <= pttl && after > 0,
        "the TTL runs on: {pttl} then {after}"
    );
}

#[tokio::test]
async fn keys_expire_when_the_bucket_is_full_again() {
    let Some(s) = RedisServer::start("keys_expire_when_the_bucket_is_full_again") else {
        return;
    };
    let con = connect(&s).await;
    let g = Gcra::new(con.clone(), per_minute(), 3).unwrap();
    let t = g.throttle("e", 2).await.unwrap();
    let pttl: u128 = s.cli(&["pttl", "turnstile:gcra:e"]).parse().unwrap();
    let reset = t.reset_after.as_millis();
    // PX is reset_after rounded up to whole ms, then counting down.
    assert!(
        pttl <= reset + 1 && pttl + 1000 > reset,
        "{pttl} ms vs {t:?}"
    );
    assert!(about(t.reset_after, 2 * MINUTE));

    // A fast limit: 1 permit every 20 ms. The key lives 20 ms (at least 1 ms).
    let fast = Gcra::new(con, Limit::per_second(50.0).unwrap(), 1).unwrap();
    let t = fast.throttle("f", 1).await.unwrap();
    assert!(
        t.allowed && t.reset_after <= Duration::from_millis(20),
        "{t:?}"
    );
    let pttl: i64 = s.cli(&["pttl", "turnstile:gcra:f"]).parse().unwrap();
    assert!((0..=20).contains(&pttl) || pttl == -2, "pttl {pttl}");
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(s.cli(&["exists", "turnstile:gcra:f"]), "0", "expired");
    // And the bucket is full again, as the expiry says.
    let t = fast.peek("f").await.unwrap();
    assert_eq!((t.remaining, t.reset_after), (1, Duration::ZERO));
}

#[tokio::test]
async fn script_flush_mid_run_reloads_transparently() {
    let Some(s) = RedisServer::start("script_flush_mid_run_reloads_transparently") else {
        return;
    };
    let g = Gcra::new(connect(&s).await, per_minute(), 10).unwrap();
    for i in 0..10u32 {
        if i % 3 == 1 {
            assert_eq!(s.cli(&["script", "flush"]), "OK");
        }
        let t = g.throttle("flush", 1).await.unwrap();
        assert!(t.allowed && t.remaining == 9 - i, "call {i}: {t:?}");
    }
    assert_eq!(s.cli(&["script", "flush"]), "OK");
    assert!(!g.throttle("flush", 1).await.unwrap().allowed);
    assert!(g.ping().await.is_ok());
}

/// A connection that counts what it is asked to send and never sends it.
#[derive(Clone, Default)]
pub(crate) struct Counting(pub(crate) Arc<AtomicUsize>);

impl ConnectionLike for Counting {
    fn req_packed_command<'a>(
        &'a mut self,
        _: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Err(std::io::Error::other("no server").into()) })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        _: &'a redis::Pipeline,
        _: usize,
        _: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Err(std::io::Error::other("no server").into()) })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

#[tokio::test]
async fn bad_input_is_refused_before_any_round_trip() {
    let con = Counting::default();
    let sent = con.0.clone();
    let ten = Limit::per_second(10.0).unwrap();
    assert_eq!(
        Gcra::new(con.clone(), Limit::ZERO, 5).unwrap_err(),
        ConfigError::ZeroRate
    );
    assert_eq!(
        Gcra::new(con.clone(), ten, 0).unwrap_err(),
        ConfigError::ZeroCapacity
    );
    let g = Gcra::new(con.clone(), ten, 5).unwrap();
    assert!(matches!(
        g.throttle("", 1).await,
        Err(RedisLimitError::EmptyKey)
    ));
    assert!(matches!(g.peek("").await, Err(RedisLimitError::EmptyKey)));
    assert!(matches!(
        g.throttle("k", 6).await,
        Err(RedisLimitError::ExceedsBurst { n: 6, burst: 5 })
    ));
    assert!(matches!(
        g.try_check_n("", 1).await,
        Err(RedisLimitError::EmptyKey)
    ));
    assert!(matches!(
        g.try_check_n("k", u32::MAX).await,
        Err(RedisLimitError::ExceedsBurst { .. })
    ));
    assert_eq!(sent.load(Ordering::SeqCst), 0, "nothing was sent");
    // A good call does go out (and fails on this connection as a connectivity error).
    let err = g.throttle("k", 5).await.unwrap_err();
    assert!(err.is_connectivity(), "{err:?}");
    assert!(sent.load(Ordering::SeqCst) > 0);

    // Limit::INF is no limit: allowed without a round trip (bad input is still refused).
    let sent_before = sent.load(Ordering::SeqCst);
    let inf = Gcra::new(con, Limit::INF, 3).unwrap();
    let t = inf.throttle("k", 3).await.unwrap();
    assert!(
        t.allowed && t.remaining == 3 && t.retry_after.is_none(),
        "{t:?}"
    );
    assert_eq!(inf.try_check_n("k", 1).await.unwrap(), Ok(()));
    assert!(matches!(
        inf.throttle("k", 4).await,
        Err(RedisLimitError::ExceedsBurst { n: 4, burst: 3 })
    ));
    assert_eq!(sent.load(Ordering::SeqCst), sent_before);
}

#[test]
fn the_local_fallback_has_the_scaled_configuration() {
    let g = Gcra::new(Counting::default(), Limit::per_second(100.0).unwrap(), 10).unwrap();
    let l = g.local(0.25);
    assert_eq!(l.limit().as_f64(), 25.0);
    assert_eq!(l.burst(), 3); // ceil(2.5)
    assert!(l.check_n(3).is_ok() && l.check().is_err());
    assert_eq!(g.local(1.0).burst(), 10);
    assert_eq!(g.local(0.01).burst(), 1);
    assert_eq!(g.local(0.01).limit().as_f64(), 1.0);
}

/// The shared limit: 4 clients (each its own connection, on its own thread and
/// runtime), 2 tasks each, on one key for about 2 s at 500/s. Total granted is at most
/// `burst + rate × elapsed + n` and at least 98 % of it (demand far exceeds the rate).
#[test]
fn one_limit_shared_by_four_clients() {
    let Some(s) = RedisServer::start("one_limit_shared_by_four_clients") else {
        return;
    };
    const RATE: f64 = 500.0;
    const BURST: u32 = 50;
    let run = redis_shared::run(&s.url(), "shared", Duration::from_secs(2), 4, 2, |con| {
        Gcra::new(con, Limit::per_second(RATE).unwrap(), BURST).unwrap()
    });
    redis_shared::assert_within_the_limit(&run, RATE, BURST);
}

/// The TAT as (µs, units of 10⁻¹⁸ s) from the key's string.
fn tat_units(s: &RedisServer, key: &str) -> u128 {
    let v = s.cli(&["get", key]);
    let (us, frac) = v.split_once('.').expect("µs.units");
    assert_eq!(frac.len(), 12, "{v}");
    us.parse::<u128>().unwrap() * 1_000_000_000_000 + frac.parse::<u128>().unwrap()
}

/// Grants add exactly `n × T` to the TAT, even where `T` is no whole number of µs or ns (7 per
/// minute: T = 8.571428571428571428... s): nothing is rounded per grant, so nothing drifts.
#[tokio::test]
async fn grants_add_exactly_n_times_t() {
    let Some(s) = RedisServer::start("grants_add_exactly_n_times_t") else {
        return;
    };
    let g = Gcra::new(
        connect(&s).await,
        Limit::per_second(7.0 / 60.0).unwrap(),
        100_000,
    )
    .unwrap();
    let key = "turnstile:gcra:exact";
    assert!(g.throttle("exact", 1).await.unwrap().allowed);
    let first = tat_units(&s, key);
    let mut total = 0u128;
    for n in [600, 1, 7, 3_333, 59] {
        assert!(g.throttle("exact", n).await.unwrap().allowed);
        total += u128::from(n);
    }
    let grown = tat_units(&s, key) - first;
    // total × 60/7 s in units, within 10⁻¹² of it (T comes from the f64 limit, ~10⁻¹⁶
    // relative; a T rounded to whole ns would be 7·10⁻¹¹ off, to whole µs 7·10⁻⁸).
    let exact = total * 60_000_000_000_000_000_000 / 7;
    assert!(
        grown.abs_diff(exact) < exact / 1_000_000_000_000,
        "TAT grew {grown} units for {total} permits; exact {exact}"
    );
    // remaining counts whole permits of that exact T.
    let t = g.peek("exact").await.unwrap();
    assert!(
        t.remaining < 100_000 - 4_000 && t.remaining >= 100_000 - 4_001,
        "{t:?}"
    );
}

/// Two configurations on one key (a rolling deploy that lowers the burst): the new one reads
/// the old one's TAT as fewer permits, never as an error.
#[tokio::test]
async fn a_key_from_another_configuration_reads_as_fewer_permits() {
    let Some(s) = RedisServer::start("a_key_from_another_configuration_reads_as_fewer_permits")
    else {
        return;
    };
    let con = connect(&s).await;
    let old = Gcra::new(con.clone(), per_minute(), 10).unwrap();
    let new = Gcra::new(con, per_minute(), 2).unwrap();
    assert!(old.throttle("deploy", 10).await.unwrap().allowed);
    let t = new.throttle("deploy", 1).await.unwrap();
    assert!(!t.allowed && t.remaining == 0 && t.limit == 2, "{t:?}");
    // 10 minutes below full, 2 of capacity: one permit in 9 minutes.
    assert!(about(t.retry_after.unwrap(), 9 * MINUTE), "{t:?}");
    assert!(about(t.reset_after, 10 * MINUTE), "{t:?}");
    assert_eq!(new.peek("deploy").await.unwrap().remaining, 0);
}

/// Every command the server has run, by name, with its count (`INFO commandstats`; the
/// script's own calls included), leaving out the `INFO`s that read them.
fn commands(s: &RedisServer) -> std::collections::BTreeMap<String, u64> {
    s.cli(&["info", "commandstats"])
        .lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| {
            let (name, rest) = l.split_once(":calls=")?;
            let calls = rest.split(',').next()?.parse().ok()?;
            (name != "info").then(|| (name.to_string(), calls))
        })
        .collect()
}

/// What ran between two [`commands`] readings.
fn ran(
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
) -> Vec<(String, u64)> {
    after
        .iter()
        .map(|(k, &v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, d)| *d > 0)
        .collect()
}

/// `try_check_n_status` answers the `QuotaStatus` of the check's own `Throttle`, exactly:
/// `q` = burst, `w` = burst × T (3 per minute: 180 s; 7 at 3/s: 7 × T rounded up to the ns,
/// not the float 7/3 s), `r` = whole permits left, `t` = until full. A check on an untouched
/// key starts from a full bucket (d = 0), so its reset is exactly n × T; later ones lose the
/// real time spent (well under a second), so their whole seconds are exact. One script call,
/// the very commands `try_check_n` sends.
#[tokio::test]
async fn the_status_of_a_check_is_its_throttles_exactly() {
    let Some(s) = RedisServer::start("the_status_of_a_check_is_its_throttles_exactly") else {
        return;
    };
    let g = Gcra::new(connect(&s).await, per_minute(), 3).unwrap();
    let status = |remaining, reset| QuotaStatus {
        quota: 3,
        window: 3 * MINUTE,
        remaining,
        reset,
    };
    let granted = |remaining, reset| StatusVerdict {
        result: Ok(()),
        status: Some(status(remaining, reset)),
    };
    assert_eq!(
        g.try_check_n_status("st", 1).await.unwrap(),
        granted(2, MINUTE)
    );
    for (left, minutes) in [(1, 2), (0, 3)] {
        let answer = g.try_check_n_status("st", 1).await.unwrap();
        assert_eq!(answer.result, Ok(()));
        let st = answer.status.unwrap();
        assert_eq!(st, status(left, st.reset), "{st:?}");
        assert!(about(st.reset, MINUTE * minutes), "{st:?}");
        assert_eq!(st.reset_secs(), 60 * u64::from(minutes), "{st:?}");
    }
    // The refusal's status: nothing left, full again in 3 minutes (less the time spent).
    let answer = g.try_check_n_status("st", 1).await.unwrap();
    let retry = answer.result.unwrap_err().retry_after().unwrap();
    let st = answer.status.unwrap();
    assert_eq!(st, status(0, st.reset), "{st:?}");
    assert_eq!((st.window_secs(), st.reset_secs()), (180, 180), "{st:?}");
    // Exactly: reset = d and retry = d + T - tau, so reset - retry = 2 minutes, to within
    // the local clock's reading between the reply and the Denied (retry is re-dated on it).
    assert!(st.reset - retry >= 2 * MINUTE, "{st:?} {retry:?}");
    // n permits from a full bucket: reset n × T exactly, r = burst - n.
    assert_eq!(
        g.try_check_n_status("two", 2).await.unwrap(),
        granted(1, 2 * MINUTE)
    );
    // A denied n > remaining still tells the permits there are: 1 of the 3 needed.
    let answer = g.try_check_n_status("two", 3).await.unwrap();
    assert!(answer.result.is_err());
    assert_eq!(answer.status.unwrap().remaining, 1);

    // A T that is no whole number of ns: the window is burst × T in the limiter's units,
    // rounded up once (7 × 333_333_333.333333333 ns = 2_333_333_333.333333331 ns).
    let odd = Gcra::new(connect(&s).await, Limit::per_second(3.0).unwrap(), 7).unwrap();
    assert_eq!(
        odd.try_check_n_status("odd", 1).await.unwrap().status,
        Some(QuotaStatus {
            quota: 7,
            window: Duration::from_nanos(2_333_333_334),
            remaining: 6,
            reset: Duration::from_nanos(333_333_334),
        })
    );

    // The same commands as a plain check (warmed up first: the script is loaded).
    let before = commands(&s);
    assert_eq!(g.try_check_n("cmd-a", 1).await.unwrap(), Ok(()));
    let plain = ran(&before, &commands(&s));
    let before = commands(&s);
    assert!(g
        .try_check_n_status("cmd-b", 1)
        .await
        .unwrap()
        .status
        .is_some());
    assert_eq!(ran(&before, &commands(&s)), plain);
    assert_eq!(
        plain.iter().find(|(c, _)| c == "evalsha").map(|c| c.1),
        Some(1),
        "{plain:?}"
    );

    // Limit::INF: no round trip, the whole burst, nothing to wait for.
    let con = Counting::default();
    let sent = con.0.clone();
    let inf = Gcra::new(con, Limit::INF, 4).unwrap();
    assert_eq!(
        inf.try_check_n_status("k", 2).await.unwrap(),
        StatusVerdict {
            result: Ok(()),
            status: Some(QuotaStatus {
                quota: 4,
                window: Duration::ZERO,
                remaining: 4,
                reset: Duration::ZERO,
            }),
        }
    );
    assert_eq!(sent.load(Ordering::SeqCst), 0, "nothing was sent");
}
