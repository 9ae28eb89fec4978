//! `turnstile::redis::FixedWindow` against real redis-servers: go-zero's `PeriodLimit` table
//! (seed-semantics §4.2), go-zero's own script text run side by side on the same server,
//! alignment with an explicit UTC offset (D14), status, expiry, bad input, a 3-master
//! cluster and `SCRIPT FLUSH`.
#![cfg(feature = "redis")]

use crate::common;

use std::time::Duration;

use common::redis_server::{RedisCluster, RedisServer};
use redis::aio::ConnectionLike;
use turnstile::redis::fixed_window::{WindowStatus, STATUS_SCRIPT, TAKE_SCRIPT};
use turnstile::redis::{
    ConnectionManager, FixedWindow, RedisLimitError, RedisLimiter, StatusVerdict,
};
use turnstile::{ConfigError, Limiter, Outcome, QuotaStatus};

/// go-zero's `core/limit/periodscript.lua`, verbatim (tests/data/go-zero/README.md).
const GO_ZERO_PERIOD_SCRIPT: &str = include_str!("../data/go-zero/periodscript.lua");

const DAY: u64 = 86_400;
const UTC8: i64 = 8 * 3600;

async fn manager(s: &RedisServer) -> ConnectionManager {
    let client = redis::Client::open(s.url()).expect("a client");
    ConnectionManager::new(client).await.expect("a connection")
}

/// A window with go-zero's keys: no prefix, so the tests read the keys go-zero names.
fn window(con: ConnectionManager, quota: u32, secs: u64) -> FixedWindow<ConnectionManager> {
    FixedWindow::builder(quota, Duration::from_secs(secs))
        .prefix("")
        .build(con)
        .expect("a valid window")
}

/// go-zero's script by `EVAL` (its text, not a hash), as go-redis's `Script.Run` falls back
/// to: `KEYS = [key]`, `ARGV = [quota, window]`.
async fn go_zero_take<C: ConnectionLike>(con: &mut C, key: &str, quota: u32, window: u64) -> i64 {
    redis::cmd("EVAL")
        .arg(GO_ZERO_PERIOD_SCRIPT)
        .arg(1)
        .arg(key)
        .arg(quota)
        .arg(window)
        .query_async(con)
        .await
        .expect("go-zero's script")
}

/// go-zero's mapping of its script's reply (periodlimit.go).
fn go_zero_outcome(reply: i64) -> Outcome {
    match reply {
        0 => Outcome::OverQuota,
        1 => Outcome::Allowed,
        2 => Outcome::HitQuota,
        other => panic!("go-zero's script never returns {other}"),
    }
}

async fn get(con: &mut ConnectionManager, key: &str) -> Option<i64> {
    redis::cmd("GET").arg(key).query_async(con).await.unwrap()
}

/// The key's TTL is `secs` seconds, less what the test's own round trips took since it was
/// set (up to a second, so a loaded machine does not fail the test).
async fn ttl_is(con: &mut ConnectionManager, key: &str, secs: u64) {
    let left = pttl(con, key).await;
    let full = secs as i64 * 1000;
    assert!(
        left <= full && left > full - 1000,
        "{key}: PTTL {left} ms, expected a TTL of {secs} s"
    );
}

async fn pttl(con: &mut ConnectionManager, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(con).await.unwrap()
}

async fn pexpire(con: &mut ConnectionManager, key: &str, ms: u64) {
    let set: i64 = redis::cmd("PEXPIRE")
        .arg(key)
        .arg(ms)
        .query_async(con)
        .await
        .unwrap();
    assert_eq!(set, 1, "PEXPIRE {key}");
}

/// A small deterministic PRNG (xorshift64*), so failures replay.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// seed-semantics §4.2's observed outputs: quota 5, window 100, calls 1..7 reply
/// 1 1 1 1 2 0 0 (Allowed ×4, HitQuota, OverQuota ×2), the counter goes 1..7 (over-quota calls
/// count too) and the TTL is 100 throughout. go-zero's script on a twin key says the same.
#[tokio::test]
async fn go_zero_table_quota_5_window_100() {
    let Some(s) = RedisServer::start("go_zero_table_quota_5_window_100") else {
        return;
    };
    let mut con = manager(&s).await;
    let w = window(con.clone(), 5, 100);
    let expected = [1, 1, 1, 1, 2, 0, 0];
    for (i, reply) in expected.into_iter().enumerate() {
        let call = i as i64 + 1;
        let ours = w.take("k").await.unwrap();
        let theirs = go_zero_take(&mut con, "twin", 5, 100).await;
        assert_eq!(theirs, reply, "go-zero's script, call {call}");
        assert_eq!(ours, go_zero_outcome(reply), "call {call}");
        assert_eq!(
            get(&mut con, "k").await,
            Some(call),
            "counter after call {call}"
        );
        assert_eq!(get(&mut con, "twin").await, Some(call));
        ttl_is(&mut con, "k", 100).await;
        ttl_is(&mut con, "twin", 100).await;
    }
    assert!(w.take("k").await.unwrap() == Outcome::OverQuota);
}

/// quota 1: the first call is HitQuota (go-zero#1581), then OverQuota; go-zero's script
/// replies 2 then 0.
#[tokio::test]
async fn quota_1_hits_then_is_over() {
    let Some(s) = RedisServer::start("quota_1_hits_then_is_over") else {
        return;
    };
    let mut con = manager(&s).await;
    let w = window(con.clone(), 1, 100);
    assert_eq!(w.take("k").await.unwrap(), Outcome::HitQuota);
    assert_eq!(w.take("k").await.unwrap(), Outcome::OverQuota);
    assert_eq!(go_zero_take(&mut con, "twin", 1, 100).await, 2);
    assert_eq!(go_zero_take(&mut con, "twin", 1, 100).await, 0);
    assert_eq!(get(&mut con, "k").await, Some(2));
}

/// The TTL is set on the first hit only: later calls (permitted or not) leave it running
/// down, so the window is fixed.
#[tokio::test]
async fn the_ttl_is_set_on_the_first_hit_only() {
    let Some(s) = RedisServer::start("the_ttl_is_set_on_the_first_hit_only") else {
        return;
    };
    let mut con = manager(&s).await;
    let w = window(con.clone(), 3, 100);
    assert_eq!(w.take("k").await.unwrap(), Outcome::Allowed);
    pexpire(&mut con, "k", 50_000).await;
    assert_eq!(w.take("k").await.unwrap(), Outcome::Allowed);
    assert_eq!(w.take("k").await.unwrap(), Outcome::HitQuota);
    assert_eq!(w.take("k").await.unwrap(), Outcome::OverQuota);
    let left = pttl(&mut con, "k").await;
    assert!((49_000..=50_000).contains(&left), "PTTL {left}");
    // Aligned, too: a take at another time does not move the window's end.
    let a = FixedWindow::builder(3, Duration::from_secs(DAY))
        .prefix("")
        .align(UTC8)
        .build(con.clone())
        .unwrap();
    assert!(a.take_at("a", 1_704_110_400).await.unwrap().is_permitted()); // 4 h to local midnight
    assert!(a.take_at("a", 1_704_124_800).await.unwrap().is_permitted()); // a new local day would be 86 400
    ttl_is(&mut con, "a", 14_400).await;
}

/// go-zero's own script and turnstile's, side by side on twin keys over pseudo-random
/// sequences (quotas, periods, aligned or not, window ends by DEL or PEXPIRE): the same
/// outcomes, counters and TTLs after every call.
#[tokio::test]
async fn matches_go_zeros_own_script_on_random_sequences() {
    let Some(s) = RedisServer::start("matches_go_zeros_own_script_on_random_sequences") else {
        return;
    };
    let mut con = manager(&s).await;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..12 {
        let quota = 1 + rng.below(6) as u32;
        let period = [1, 7, 60, 100, 3600, DAY][rng.below(6) as usize];
        let aligned = rng.below(2) == 0;
        let offset = rng.below(2 * DAY - 1) as i64 - (DAY as i64 - 1);
        let mut b =
            FixedWindow::builder(quota, Duration::from_secs(period)).prefix(format!("r{round}:"));
        if aligned {
            b = b.align(offset);
        }
        let w = b.build(con.clone()).unwrap();
        let ours = w.redis_key("ours");
        let theirs = w.redis_key("theirs");
        for step in 0..25 {
            let now = 1_700_000_000 + rng.below(1_000_000);
            match rng.below(10) {
                0 => {
                    let _: () = redis::cmd("DEL")
                        .arg(&ours)
                        .arg(&theirs)
                        .query_async(&mut con)
                        .await
                        .unwrap();
                }
                1 if get(&mut con, &ours).await.is_some() => {
                    pexpire(&mut con, &ours, 1).await;
                    pexpire(&mut con, &theirs, 1).await;
                    tokio::time::sleep(Duration::from_millis(3)).await;
                }
                _ => {}
            }
            let a = w.take_at("ours", now).await.unwrap();
            let g = go_zero_take(&mut con, &theirs, quota, w.expire_secs_at(now)).await;
            let at = format!("round {round} (quota {quota}, period {period}, aligned {aligned} {offset}) step {step}");
            assert_eq!(a, go_zero_outcome(g), "{at}");
            assert_eq!(
                get(&mut con, &ours).await,
                get(&mut con, &theirs).await,
                "{at}"
            );
            let (p, q) = (pttl(&mut con, &ours).await, pttl(&mut con, &theirs).await);
            assert!(
                p > 0 && q > 0 && (p - q).abs() <= 1000,
                "{at}: PTTL {p} vs {q}"
            );
        }
    }
}

/// One key, written by go-zero's script and by turnstile's in random turns: each reads what
/// the other wrote (the counter goes on, the TTL set by whoever came first stays), and both
/// answer what one script alone would. turnstile's `status` reads go-zero's key.
#[tokio::test]
async fn one_key_shared_by_go_zero_and_turnstile() {
    let Some(s) = RedisServer::start("one_key_shared_by_go_zero_and_turnstile") else {
        return;
    };
    let mut con = manager(&s).await;
    let mut rng = Rng(42);
    let w = FixedWindow::builder(4, Duration::from_secs(100))
        .prefix("periodlimit:")
        .build(con.clone())
        .unwrap();
    for round in 0..8 {
        let key = format!("user{round}");
        let full = format!("periodlimit:{key}");
        for call in 1..=7i64 {
            let expected = match call.cmp(&4) {
                std::cmp::Ordering::Less => Outcome::Allowed,
                std::cmp::Ordering::Equal => Outcome::HitQuota,
                std::cmp::Ordering::Greater => Outcome::OverQuota,
            };
            let by_go = rng.below(2) == 0;
            let got = if by_go {
                go_zero_outcome(go_zero_take(&mut con, &full, 4, 100).await)
            } else {
                w.take(&key).await.unwrap()
            };
            assert_eq!(
                got, expected,
                "round {round} call {call} by go-zero: {by_go}"
            );
            assert_eq!(get(&mut con, &full).await, Some(call));
            ttl_is(&mut con, &full, 100).await;
            let st = w.status(&key).await.unwrap();
            assert_eq!(st.remaining, (4 - call).max(0) as u32);
        }
    }
}

/// seed-semantics §4.2's Align examples with the offset explicit (UTC+8) through the `_at`
/// forms, and a negative offset.
#[tokio::test]
async fn alignment_with_an_explicit_utc_offset() {
    let Some(s) = RedisServer::start("alignment_with_an_explicit_utc_offset") else {
        return;
    };
    let mut con = manager(&s).await;
    let c = con.clone();
    let aligned = |period: u64, offset: i64| {
        FixedWindow::builder(5, Duration::from_secs(period))
            .prefix("")
            .align(offset)
            .build(c.clone())
            .unwrap()
    };
    let day8 = aligned(DAY, UTC8);
    // 2024-01-01 23:59:59 in UTC+8 → 1 s; one second later (local midnight) → 86 400.
    assert_eq!(day8.expire_secs_at(1_704_124_799), 1);
    assert_eq!(
        day8.take_at("a", 1_704_124_799).await.unwrap(),
        Outcome::Allowed
    );
    let left = pttl(&mut con, "a").await;
    assert!(left == -2 || (1..=1000).contains(&left), "PTTL {left}");
    assert_eq!(
        day8.take_at("b", 1_704_124_800).await.unwrap(),
        Outcome::Allowed
    );
    ttl_is(&mut con, "b", 86_400).await;
    // 20:00 in UTC+8 → 4 h; with period 60 → 60.
    assert_eq!(
        day8.take_at("c", 1_704_110_400).await.unwrap(),
        Outcome::Allowed
    );
    ttl_is(&mut con, "c", 14_400).await;
    let minute8 = aligned(60, UTC8);
    assert!(minute8
        .take_at("d", 1_704_110_400)
        .await
        .unwrap()
        .is_permitted());
    ttl_is(&mut con, "d", 60).await;
    // UTC-5: 12:00 UTC is 07:00 local, 17 h to local midnight.
    let day_minus5 = aligned(DAY, -5 * 3600);
    assert!(day_minus5
        .take_at("e", 1_704_110_400)
        .await
        .unwrap()
        .is_permitted());
    ttl_is(&mut con, "e", 17 * 3600).await;
    // UTC itself: 12:00 UTC, 12 h.
    let day0 = aligned(DAY, 0);
    assert_eq!(day0.utc_offset_secs(), Some(0));
    assert!(day0
        .take_at("f", 1_704_110_400)
        .await
        .unwrap()
        .is_permitted());
    ttl_is(&mut con, "f", 12 * 3600).await;
    // Unaligned windows ignore the time: a whole period from the first hit.
    assert!(window(con.clone(), 5, DAY)
        .take_at("g", 1_704_124_799)
        .await
        .unwrap()
        .is_permitted());
    ttl_is(&mut con, "g", 86_400).await;
    // A status with no window open says when the window a request would open ends.
    let st = day8.status_at("fresh", 1_704_124_799).await.unwrap();
    assert_eq!(
        st,
        WindowStatus {
            quota: 5,
            remaining: 5,
            resets_after: Duration::from_secs(1)
        }
    );
}

/// `status`: remaining is the quota less the count, at least 0; the reset is the key's PTTL;
/// with no key, the whole quota and a whole period; a status reads and writes nothing. A
/// counter without a TTL (from another writer) gets one on the next take.
/// The status of a check comes from the take script's own reply (the count after the
/// increment, the key's PTTL): q = quota, w = period, r = quota - count (0 once over: a
/// refused call still counts), t = the key's TTL, exactly the new window's on the call that
/// opens it (aligned: until the next boundary).
#[tokio::test]
async fn the_status_of_a_check_is_the_count_and_ttl_it_left() {
    let Some(s) = RedisServer::start("the_status_of_a_check_is_the_count_and_ttl_it_left") else {
        return;
    };
    let mut con = manager(&s).await;
    let w = window(con.clone(), 5, 60);
    let st = |remaining, reset| QuotaStatus {
        quota: 5,
        window: Duration::from_secs(60),
        remaining,
        reset,
    };
    assert_eq!(
        w.try_check_n_status_at("k", 1_000_000, 2).await.unwrap(),
        StatusVerdict {
            result: Ok(()),
            status: Some(st(3, Duration::from_secs(60))),
        }
    );
    // The quota-th permit passes (HitQuota) and leaves nothing; the next is refused and
    // counted. The TTL runs on the server's clock: whole seconds are exact.
    for (n, ok, left) in [(3, true, 0), (1, false, 0)] {
        let StatusVerdict { result, status } =
            RedisLimiter::try_check_n_status(&w, "k", n).await.unwrap();
        assert_eq!(result.is_ok(), ok, "take {n}");
        let status = status.unwrap();
        assert_eq!(status, st(left, status.reset));
        assert_eq!(status.reset_secs(), 60, "{status:?}");
        // The key's TTL, read just after: no later, and the same but for that moment.
        let (reset, ttl) = (status.reset.as_millis() as i64, pttl(&mut con, "k").await);
        assert!(
            ttl <= reset && reset - ttl < 1_000,
            "{status:?}, then PTTL {ttl}"
        );
    }
    assert_eq!(get(&mut con, "k").await, Some(6));
    // n = 0 makes no round trip: nothing to tell.
    assert_eq!(
        w.try_check_n_status_at("k", 1_000_000, 0).await.unwrap(),
        StatusVerdict {
            result: Ok(()),
            status: None,
        }
    );
    // Aligned to the minute: a window opened 10 s into it ends in 50 s.
    let aligned = FixedWindow::builder(5, Duration::from_secs(60))
        .prefix("")
        .align(0)
        .build(con.clone())
        .unwrap();
    let answer = aligned
        .try_check_n_status_at("a", 1_699_999_990, 1)
        .await
        .unwrap();
    assert_eq!(answer.status, Some(st(4, Duration::from_secs(50))));
}

#[tokio::test]
async fn status_remaining_and_reset() {
    let Some(s) = RedisServer::start("status_remaining_and_reset") else {
        return;
    };
    let mut con = manager(&s).await;
    let w = window(con.clone(), 5, 100);
    let st = w.status("k").await.unwrap();
    assert_eq!(
        st,
        WindowStatus {
            quota: 5,
            remaining: 5,
            resets_after: Duration::from_secs(100)
        }
    );
    assert_eq!(st.reset_secs(), 100);
    assert_eq!(get(&mut con, "k").await, None, "a status writes nothing");
    for _ in 0..2 {
        let _ = w.take("k").await.unwrap();
    }
    pexpire(&mut con, "k", 12_800).await;
    let st = w.status("k").await.unwrap();
    assert_eq!((st.quota, st.remaining), (5, 3));
    let ms = st.resets_after.as_millis();
    assert!((12_001..=12_800).contains(&ms), "resets after {ms} ms");
    assert_eq!(st.reset_secs(), 13, "rounded up");
    for _ in 0..5 {
        let _ = w.take("k").await.unwrap();
    }
    assert_eq!(get(&mut con, "k").await, Some(7));
    assert_eq!(
        w.status("k").await.unwrap().remaining,
        0,
        "over quota: 0, not negative"
    );
    assert_eq!(get(&mut con, "k").await, Some(7), "a status writes nothing");
    // A counter with no TTL, written by something else.
    let _: () = redis::cmd("SET")
        .arg("bare")
        .arg(3)
        .query_async(&mut con)
        .await
        .unwrap();
    let st = w.status("bare").await.unwrap();
    assert_eq!(
        (st.remaining, st.resets_after),
        (2, Duration::from_secs(100))
    );
    assert_eq!(pttl(&mut con, "bare").await, -1, "a status writes nothing");
    assert_eq!(w.take("bare").await.unwrap(), Outcome::Allowed);
    ttl_is(&mut con, "bare", 100).await; // the take gave it a window
                                         // A counter that is no number is an error, not a panic.
    let _: () = redis::cmd("SET")
        .arg("junk")
        .arg("x")
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(matches!(
        w.status("junk").await,
        Err(RedisLimitError::UnexpectedReply(_))
    ));
    assert!(matches!(
        w.take("junk").await,
        Err(RedisLimitError::Redis(_))
    ));
}

/// Idle keys expire: when a window's TTL runs out the key is gone and the whole quota is back.
#[tokio::test]
async fn idle_keys_expire() {
    let Some(s) = RedisServer::start("idle_keys_expire") else {
        return;
    };
    let mut con = manager(&s).await;
    let w = window(con.clone(), 2, 1);
    assert_eq!(w.take_n("k", 2).await.unwrap(), Outcome::HitQuota);
    let left = pttl(&mut con, "k").await;
    assert!((1..=1000).contains(&left), "a 1 s window: PTTL {left}");
    assert_eq!(w.take("k").await.unwrap(), Outcome::OverQuota);
    pexpire(&mut con, "k", 20).await;
    tokio::time::sleep(Duration::from_millis(60)).await;
    let exists: i64 = redis::cmd("EXISTS")
        .arg("k")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(exists, 0, "the idle key expired");
    assert_eq!(w.status("k").await.unwrap().remaining, 2);
    assert_eq!(w.take("k").await.unwrap(), Outcome::Allowed);
    assert_eq!(get(&mut con, "k").await, Some(1));
}

/// `take_n` is `INCRBY n`: counted like n go-zero calls at once, refused ones included.
#[tokio::test]
async fn take_n_counts_like_n_go_zero_calls() {
    let Some(s) = RedisServer::start("take_n_counts_like_n_go_zero_calls") else {
        return;
    };
    let mut con = manager(&s).await;
    let w = window(con.clone(), 5, 100);
    assert_eq!(w.take_n("k", 3).await.unwrap(), Outcome::Allowed);
    assert_eq!(w.take_n("k", 3).await.unwrap(), Outcome::OverQuota);
    assert_eq!(get(&mut con, "k").await, Some(6), "a refused take_n counts");
    assert_eq!(w.take_n("k", 2).await.unwrap(), Outcome::OverQuota);
    assert_eq!(get(&mut con, "k").await, Some(8));
    assert_eq!(w.take_n("h", 5).await.unwrap(), Outcome::HitQuota);
    assert_eq!(w.take_n("a", 4).await.unwrap(), Outcome::Allowed);
    assert_eq!(
        w.take_n("a", 2).await.unwrap(),
        Outcome::OverQuota,
        "4 + 2 > 5"
    );
    assert_eq!(
        w.take("a").await.unwrap(),
        Outcome::OverQuota,
        "the refused 2 spent the last"
    );
    // n = 0: Allowed, nothing counted, no key made.
    assert_eq!(w.take_n("z", 0).await.unwrap(), Outcome::Allowed);
    assert_eq!(get(&mut con, "z").await, None);
}

/// Bad input is a typed error with no round trip (no command reaches the server); the D14
/// configurations are `ConfigError`s; periods round up to whole seconds.
#[tokio::test]
async fn bad_input_and_d14_config_errors() {
    let Some(s) = RedisServer::start("bad_input_and_d14_config_errors") else {
        return;
    };
    let mut con = manager(&s).await;
    let w = window(con.clone(), 3, 100);
    s.cli(&["config", "resetstat"]);
    assert!(matches!(w.take("").await, Err(RedisLimitError::EmptyKey)));
    assert!(matches!(
        w.take_n("", 0).await,
        Err(RedisLimitError::EmptyKey)
    ));
    assert!(matches!(w.status("").await, Err(RedisLimitError::EmptyKey)));
    assert!(matches!(
        w.try_check_n("", 1).await,
        Err(RedisLimitError::EmptyKey)
    ));
    let e = w.take_n("k", 4).await.unwrap_err();
    assert!(
        matches!(e, RedisLimitError::ExceedsBurst { n: 4, burst: 3 }),
        "{e}"
    );
    assert!(!e.is_connectivity());
    assert!(matches!(
        w.try_check_n("k", 4).await,
        Err(RedisLimitError::ExceedsBurst { n: 4, burst: 3 })
    ));
    assert_eq!(w.take_n("k", 0).await.unwrap(), Outcome::Allowed);
    assert!(w.try_check_n("k", 0).await.unwrap().is_ok());
    let stats = s.cli(&["info", "commandstats"]);
    for cmd in [
        "cmdstat_eval",
        "cmdstat_evalsha",
        "cmdstat_incrby",
        "cmdstat_get",
    ] {
        assert!(!stats.contains(&format!("{cmd}:")), "{cmd} ran: {stats}");
    }
    // D14.
    let b = FixedWindow::builder;
    assert_eq!(
        b(0, Duration::from_secs(10))
            .build(con.clone())
            .unwrap_err(),
        ConfigError::ZeroQuota
    );
    assert_eq!(
        b(1, Duration::ZERO).build(con.clone()).unwrap_err(),
        ConfigError::ZeroPeriod
    );
    assert_eq!(
        b(1, Duration::ZERO)
            .align(UTC8)
            .build(con.clone())
            .unwrap_err(),
        ConfigError::ZeroPeriod,
        "go-zero divides by zero"
    );
    for period in [
        Duration::from_millis(1_500),
        Duration::from_millis(1),
        Duration::from_secs(i64::MAX as u64 / 1000 + 1),
        Duration::MAX,
    ] {
        assert_eq!(
            b(1, period).build(con.clone()).unwrap_err(),
            ConfigError::InvalidPeriod(period),
            "never rounded"
        );
    }
    assert!(b(1, Duration::from_secs(i64::MAX as u64 / 1000))
        .build(con.clone())
        .is_ok());
    for offset in [86_400, -86_400, i64::MAX, i64::MIN] {
        assert_eq!(
            b(1, Duration::from_secs(60))
                .align(offset)
                .build(con.clone())
                .unwrap_err(),
            ConfigError::InvalidUtcOffset(offset)
        );
    }
    for offset in [86_399, -86_399] {
        let ok = b(1, Duration::from_secs(60))
            .align(offset)
            .build(con.clone())
            .unwrap();
        assert_eq!(ok.utc_offset_secs(), Some(offset));
    }
    // Whole seconds: the TTL of a fresh key is the period.
    let w = b(1, Duration::from_secs(2)).build(con.clone()).unwrap();
    assert_eq!(w.period(), Duration::from_secs(2));
    assert!(w.take("r").await.unwrap().is_permitted());
    let left = pttl(&mut con, &w.redis_key("r")).await;
    assert!((1_600..=2_000).contains(&left), "PTTL {left}");
}

/// The `RedisLimiter` face: a denial's retry-after is the key's remaining TTL; `ping`;
/// `local(share)` is the in-process window with the quota scaled (rounded up, at least 1),
/// the same period and alignment.
#[tokio::test]
async fn redis_limiter_denials_ping_and_local() {
    let Some(s) = RedisServer::start("redis_limiter_denials_ping_and_local") else {
        return;
    };
    let mut con = manager(&s).await;
    let w = FixedWindow::builder(2, Duration::from_secs(100))
        .prefix("p:")
        .build(con.clone())
        .unwrap();
    assert!(w.try_check_n("k", 1).await.unwrap().is_ok());
    assert!(
        w.try_check_n("k", 1).await.unwrap().is_ok(),
        "HitQuota is permitted"
    );
    let denied = w.try_check_n("k", 1).await.unwrap().unwrap_err();
    let after = denied.retry_after().unwrap();
    assert!(
        after > Duration::from_secs(98) && after <= Duration::from_secs(100),
        "{after:?}"
    );
    pexpire(&mut con, "p:k", 5_000).await;
    let denied = w.try_check_n("k", 2).await.unwrap().unwrap_err();
    let after = denied.retry_after().unwrap();
    assert!(
        after > Duration::from_millis(4_100) && after <= Duration::from_secs(5),
        "{after:?}"
    );
    assert_eq!(denied.retry_after_secs(), Some(5));
    assert_eq!(
        get(&mut con, "p:k").await,
        Some(5),
        "denied checks count (go-zero)"
    );
    w.ping().await.unwrap();

    let quota_of = |share: f64| w.local(share).quota();
    assert_eq!(quota_of(1.0), 2);
    assert_eq!(quota_of(0.5), 1);
    assert_eq!(quota_of(0.01), 1, "at least 1");
    assert_eq!(quota_of(0.0), 1);
    assert_eq!(quota_of(f64::NAN), 1);
    assert_eq!(quota_of(7.0), 2, "never above the quota");
    let big = window(con.clone(), 10, 60);
    assert_eq!(big.local(0.25).quota(), 3, "ceil(2.5)");
    assert_eq!(big.local(0.3).quota(), 3);
    let local = big.local(0.1);
    assert_eq!(
        (local.quota(), local.period(), local.utc_offset_secs()),
        (1, Duration::from_secs(60), None)
    );
    assert!(local.check().is_ok());
    assert!(local.check().is_err());
    let aligned = FixedWindow::builder(10, Duration::from_secs(DAY))
        .prefix("")
        .align(UTC8)
        .build(con.clone())
        .unwrap();
    let local = aligned.local(0.5);
    assert_eq!(local.quota(), 5);
    assert_eq!(
        local.period(),
        Duration::from_secs(DAY),
        "the rounded period"
    );
    assert_eq!(local.utc_offset_secs(), Some(UTC8));
}

/// One key shared by 4 clients (separate connections, 2 tasks each) taking as fast as they
/// can: the window grants exactly its quota in all (HitQuota once), whoever asks, and the
/// counter holds every call.
#[tokio::test]
async fn one_limit_shared_by_four_clients() {
    let Some(s) = RedisServer::start("one_limit_shared_by_four_clients") else {
        return;
    };
    let mut con = manager(&s).await;
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let w = std::sync::Arc::new(window(manager(&s).await, 200, 100));
        for _ in 0..2 {
            let w = w.clone();
            tasks.push(tokio::spawn(async move {
                let (mut permitted, mut hit, mut calls) = (0u32, 0u32, 0i64);
                loop {
                    calls += 1;
                    match w.take("shared").await.unwrap() {
                        Outcome::Allowed => permitted += 1,
                        Outcome::HitQuota => {
                            permitted += 1;
                            hit += 1;
                        }
                        Outcome::OverQuota => return (permitted, hit, calls),
                    }
                }
            }));
        }
    }
    let (mut permitted, mut hit, mut calls) = (0, 0, 0);
    for t in tasks {
        let (p, h, c) = t.await.unwrap();
        permitted += p;
        hit += h;
        calls += c;
    }
    assert_eq!((permitted, hit), (200, 1));
    assert_eq!(get(&mut con, "shared").await, Some(calls));
}

/// Many keys over the slots of a 3-master cluster, through a `ClusterConnection`: every key's
/// window works on whichever node owns it, and the keys land on every node.
#[tokio::test]
async fn cluster_many_keys_over_slots() {
    let Some(c) = RedisCluster::start("cluster_many_keys_over_slots", 3) else {
        return;
    };
    let client = redis::cluster::ClusterClient::new(c.urls()).unwrap();
    let mut con = client.get_async_connection().await.unwrap();
    let w = FixedWindow::builder(3, Duration::from_secs(100))
        .prefix("fw:")
        .build(con.clone())
        .unwrap();
    for i in 0..60 {
        let key = format!("user{i}");
        let outcomes = [
            w.take(&key).await.unwrap(),
            w.take(&key).await.unwrap(),
            w.take(&key).await.unwrap(),
            w.take(&key).await.unwrap(),
        ];
        use Outcome::*;
        assert_eq!(outcomes, [Allowed, Allowed, HitQuota, OverQuota], "{key}");
        assert_eq!(w.status(&key).await.unwrap().remaining, 0);
        assert!(w.try_check_n(&key, 1).await.unwrap().is_err());
        // go-zero's script on the same cluster agrees on a twin key.
        let twin = format!("gz:user{i}");
        for expected in [1, 1, 2, 0] {
            assert_eq!(go_zero_take(&mut con, &twin, 3, 100).await, expected);
        }
    }
    for node in &c.nodes {
        let n: usize = node.cli(&["dbsize"]).parse().unwrap();
        assert!(n > 10, "node {} holds {n} keys", node.port);
    }
    w.ping().await.unwrap();
}

/// `SCRIPT FLUSH` between calls: the next call gets NOSCRIPT, loads the script again and
/// answers as if nothing happened (both scripts).
#[tokio::test]
async fn script_flush_between_calls() {
    let Some(s) = RedisServer::start("script_flush_between_calls") else {
        return;
    };
    let mut con = manager(&s).await;
    let w = window(con.clone(), 3, 100);
    let take_sha = redis::Script::new(TAKE_SCRIPT).get_hash().to_string();
    let status_sha = redis::Script::new(STATUS_SCRIPT).get_hash().to_string();
    assert_eq!(w.take("k").await.unwrap(), Outcome::Allowed);
    assert_eq!(w.status("k").await.unwrap().remaining, 2);
    for round in 0..3 {
        assert_eq!(s.cli(&["script", "flush"]), "OK");
        assert_eq!(s.cli(&["script", "exists", &take_sha, &status_sha]), "0\n0");
        let expected = [Outcome::Allowed, Outcome::HitQuota, Outcome::OverQuota][round];
        assert_eq!(w.take("k").await.unwrap(), expected, "round {round}");
        assert_eq!(s.cli(&["script", "exists", &take_sha]), "1", "reloaded");
        s.cli(&["script", "flush"]);
        let st = w.status("k").await.unwrap();
        assert_eq!(st.remaining, (1 - round as i64).max(0) as u32);
    }
    assert_eq!(get(&mut con, "k").await, Some(4));

    // In the steady state a call is one EVALSHA: no script text is sent, nothing loaded.
    let _ = w.take("k").await.unwrap(); // loads the take script, flushed in the last round
    s.cli(&["config", "resetstat"]);
    for _ in 0..3 {
        let _ = w.take("k").await.unwrap();
        let _ = w.status("k").await.unwrap();
    }
    assert_eq!(calls(&s, "evalsha"), 6);
    assert_eq!((calls(&s, "eval"), calls(&s, "script|load")), (0, 0));
    // After a flush, the one call that meets NOSCRIPT loads its script once.
    s.cli(&["script", "flush"]);
    let _ = w.take("k").await.unwrap();
    let _ = w.take("k").await.unwrap();
    assert_eq!((calls(&s, "eval"), calls(&s, "script|load")), (0, 1));
}

/// How many times `cmd` ran since the last `CONFIG RESETSTAT` (`INFO commandstats`).
fn calls(s: &RedisServer, cmd: &str) -> u64 {
    let stats = s.cli(&["info", "commandstats"]);
    let prefix = format!("cmdstat_{cmd}:calls=");
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}
