//! `turnstile::redis::Leased` against a real redis-server of each test's own, on a manual
//! clock (the scripts then run at its time, so every figure is exact): the stated bounds with
//! several leasing clients, permits handed back by `release` and on drop, the refused-until
//! cache answering without Redis until its time, a kill and a restart (bare and under
//! `Fallback`), a cluster, and bad input.
#![cfg(feature = "redis")]

use crate::common;

use std::time::{Duration, Instant};

use common::redis_server::{RedisCluster, RedisServer};
use turnstile::redis::{
    ConnectionManager, Fallback, Gcra, LeaseStats, Leased, Mode, RedisLimitError, RedisLimiter,
};
use turnstile::{ConfigError, Limit, ManualClock, Nanos};

/// 1 000 permits a second: `T` = 1 ms exactly.
const T_US: u64 = 1_000;
const BURST: u32 = 100;
const K: u32 = 8;

type Client = Leased<ConnectionManager, ManualClock>;

async fn connect(s: &RedisServer) -> ConnectionManager {
    let client = redis::Client::open(s.url()).expect("client");
    ConnectionManager::new(client).await.expect("connect")
}

fn limit() -> Limit {
    Limit::per_second(1_000.0).unwrap()
}

/// A leasing client (a process of the fleet) on its own connection, on `clock`.
async fn client(s: &RedisServer, clock: &ManualClock, idle_after: Duration) -> Client {
    let gcra = Gcra::new(connect(s).await, limit(), BURST).unwrap();
    Leased::builder(gcra)
        .max_lease(K)
        .idle_after(idle_after)
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// A clock far from zero (the scripts' time, µs, is absolute).
fn clock() -> ManualClock {
    ManualClock::new(Nanos::new(1_000_000_000_000_000))
}

fn us(clock: &ManualClock) -> u64 {
    use turnstile::Clock;
    clock.now().as_u64() / 1_000
}

/// Waits until no client has a renewal in flight (background ones run as tasks on this
/// runtime), so that a step's outcome does not depend on when they ran.
async fn settle(clients: &[Client]) {
    let start = Instant::now();
    while clients.iter().any(|c| c.renewals_in_flight() > 0) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "renewals never ended"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A small deterministic generator (xorshift), so a failure replays.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Every grant of a run: (time in µs, permits).
#[derive(Default)]
struct Grants(Vec<(u64, u64)>);

impl Grants {
    fn total(&self) -> u64 {
        self.0.iter().map(|g| g.1).sum()
    }
    fn since(&self, t: u64) -> u64 {
        self.0.iter().filter(|g| g.0 >= t).map(|g| g.1).sum()
    }
}

/// Checks `c` until it refuses (at most 10 000 times), recording the grants.
async fn drain(c: &Client, clock: &ManualClock, grants: &mut Grants) -> u32 {
    let mut granted = 0;
    for _ in 0..10_000 {
        match c.check_n("hot", 1).await.expect("redis answers") {
            Ok(()) => {
                grants.0.push((us(clock), 1));
                granted += 1;
            }
            Err(_) => return granted,
        }
    }
    panic!("never refused");
}

/// Drains every client until a whole pass grants nothing: every process saturated, its
/// lease empty and its refusal cached.
async fn saturate(clients: &[Client], clock: &ManualClock, grants: &mut Grants) {
    loop {
        let mut granted = 0;
        for c in clients {
            granted += drain(c, clock, grants).await;
        }
        settle(clients).await;
        if granted == 0 {
            return;
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn several_leasing_clients_keep_the_stated_bounds() {
    let Some(s) = RedisServer::start("several_leasing_clients_keep_the_stated_bounds") else {
        return;
    };
    const N: u64 = 3;
    let clock = clock();
    let mut clients = Vec::new();
    for _ in 0..N {
        clients.push(client(&s, &clock, Duration::from_secs(3_600)).await);
    }
    let nk = N * u64::from(K);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut grants = Grants::default();
    let first = us(&clock);
    let budget = |from: u64, to: u64| u64::from(BURST) + (to - from) / T_US;

    // Phase 1: every client saturated from the first check. Never over the budget, never
    // more than N × k under it. And exactly: every permit of the budget (in µs of the
    // bucket's time) was admitted, is held in a lease, or is still in the bucket, which is
    // never overdrawn.
    let raw = connect(&s).await;
    for step in 0..60 {
        if step > 0 {
            clock.advance(Duration::from_micros(rng.below(4_000)));
        }
        saturate(&clients, &clock, &mut grants).await;
        let (now, admitted) = (us(&clock), grants.total());
        let d = below_full_us(&raw, &clock).await;
        assert!(
            d <= u64::from(BURST) * T_US,
            "step {step}: the bucket overdrawn: {d} µs"
        );
        // Every process saturated: a refused process waits for at most its k permits, so
        // the bucket holds fewer than k + 1 whole permits nobody admits.
        let idle_permits = (u64::from(BURST) * T_US - d) / T_US;
        assert!(
            idle_permits <= u64::from(K),
            "step {step}: {idle_permits} permits unleased"
        );
        let held: u64 = clients.iter().map(|c| c.stats().held).sum();
        assert_eq!(
            (admitted + held) * T_US,
            d + (now - first),
            "step {step}: permits lost or made"
        );
        assert!(
            admitted <= budget(first, now),
            "step {step}: over the budget"
        );
        assert!(
            admitted + nk >= budget(first, now),
            "step {step}: {admitted} admitted, more than N × k = {nk} under {}",
            budget(first, now)
        );
    }
    // The hot key's leases grew past one permit: the calls that granted brought more than
    // two permits each on average.
    let (mut granting_calls, mut leased) = (0, 0);
    for c in &clients {
        let st = c.stats();
        granting_calls += st.redis_calls - st.refused;
        leased += st.leased;
    }
    assert!(
        leased > 2 * granting_calls,
        "{leased} permits in {granting_calls} calls"
    );

    // Phase 2: light, irregular load, bigger checks, some releases.
    for _ in 0..200 {
        clock.advance(Duration::from_micros(rng.below(3_000)));
        let c = &clients[rng.below(N) as usize];
        let n = 1 + rng.below(3) as u32;
        if c.check_n("hot", n).await.unwrap().is_ok() {
            grants.0.push((us(&clock), u64::from(n)));
        }
        if rng.below(20) == 0 {
            c.release().await.unwrap();
        }
        settle(&clients).await;
        assert!(
            grants.total() <= budget(first, us(&clock)),
            "over the budget"
        );
    }

    // Phase 3: saturated again. From its first drained point on, at most N × k under what
    // the bucket refilled.
    saturate(&clients, &clock, &mut grants).await;
    let (start, before) = (us(&clock), grants.total());
    for step in 0..60 {
        clock.advance(Duration::from_micros(rng.below(4_000)));
        saturate(&clients, &clock, &mut grants).await;
        let admitted = grants.total() - before;
        let d = below_full_us(&raw, &clock).await;
        assert!(
            d <= u64::from(BURST) * T_US,
            "phase 3 step {step}: overdrawn: {d} µs"
        );
        let refilled = (us(&clock) - start) / T_US;
        assert!(
            admitted + nk >= refilled,
            "phase 3 step {step}: {admitted} < {refilled} - {nk}"
        );
        assert!(
            grants.total() <= budget(first, us(&clock)),
            "over the budget"
        );
    }

    // Over every span [a, b] of grant times: at most the budget of b - a plus N × k.
    let times: Vec<u64> = grants.0.iter().map(|g| g.0).collect();
    for &a in &times {
        for &b in times.iter().filter(|&&b| b >= a) {
            let within: u64 = grants
                .0
                .iter()
                .filter(|g| g.0 >= a && g.0 <= b)
                .map(|g| g.1)
                .sum();
            assert!(
                within <= budget(a, b) + nk,
                "[{a}, {b}]: {within} > {} + {nk}",
                budget(a, b)
            );
        }
    }
    assert!(grants.since(first) == grants.total());
}

#[tokio::test(flavor = "current_thread")]
async fn leases_are_handed_back_by_release_and_on_drop() {
    let Some(s) = RedisServer::start("leases_are_handed_back_by_release_and_on_drop") else {
        return;
    };
    let clock = clock();
    let raw = connect(&s).await;
    let remaining = || remaining(&raw, &clock);

    // A hot key: successive leases double k (each lasted less than the horizon: no time
    // passes) up to 8.
    let c = client(&s, &clock, Duration::from_secs(3_600)).await;
    for _ in 0..12 {
        assert!(c.check_n("hot", 1).await.unwrap().is_ok());
        settle(std::slice::from_ref(&c)).await;
    }
    let LeaseStats { held, leased, .. } = c.stats();
    assert!(held > 0, "a hot key holds a lease");
    assert_eq!(leased, 12 + held);
    assert_eq!(remaining().await, u64::from(BURST) - leased);
    // release hands every held permit back: the bucket has them again.
    assert_eq!(c.release().await.unwrap(), held);
    assert_eq!(c.stats().held, 0);
    assert_eq!(remaining().await, u64::from(BURST) - 12);

    // Dropping the limiter inside a runtime hands back in the background.
    for _ in 0..4 {
        assert!(c.check_n("hot", 1).await.unwrap().is_ok());
        settle(std::slice::from_ref(&c)).await;
    }
    let held = c.stats().held;
    assert!(held > 0);
    let before = remaining().await;
    drop(c);
    let start = Instant::now();
    while remaining().await != before + held {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "not handed back on drop"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// How far `hot`'s bucket is below full at the manual time, in µs: `tat - now`, or 0 (a full
/// bucket: no key).
async fn below_full_us(con: &ConnectionManager, clock: &ManualClock) -> u64 {
    let s: Option<String> = redis::cmd("GET")
        .arg("turnstile:gcra:hot")
        .query_async(&mut con.clone())
        .await
        .unwrap();
    let Some(s) = s else {
        return 0;
    };
    let (whole, frac) = s.split_once('.').unwrap();
    assert_eq!(frac, "000000000000", "T is whole µs here");
    whole.parse::<u64>().unwrap().saturating_sub(us(clock))
}

/// The whole permits left in `hot`'s bucket at the manual time.
async fn remaining(con: &ConnectionManager, clock: &ManualClock) -> u64 {
    u64::from(BURST) - below_full_us(con, clock).await / T_US
}

/// A key unused for `idle_after` (on the limiter's clock) hands its lease back: the reaper,
/// which wakes every half of it in real time, finds it idle once the manual clock has moved.
#[tokio::test(flavor = "current_thread")]
async fn an_idle_key_hands_its_lease_back() {
    let Some(s) = RedisServer::start("an_idle_key_hands_its_lease_back") else {
        return;
    };
    let clock = clock();
    let c = client(&s, &clock, Duration::from_millis(20)).await;
    for _ in 0..6 {
        assert!(c.check_n("hot", 1).await.unwrap().is_ok());
        settle(std::slice::from_ref(&c)).await;
    }
    let held = c.stats().held;
    assert!(held > 0);
    let raw = connect(&s).await;
    // Another process takes 70 more, so that the refill below cannot hide a missing return.
    let other = client(&s, &clock, Duration::from_secs(3_600)).await;
    assert!(other.check_n("hot", 70).await.unwrap().is_ok());
    assert_eq!(other.stats().held, 0, "a lease of exactly 70: nothing held");
    let left = u64::from(BURST) - 76 - held;
    // Not idle yet: several reaper rounds leave it alone.
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(c.stats().held, held, "handed back while in use");
    assert_eq!(remaining(&raw, &clock).await, left);
    clock.advance(Duration::from_millis(25));
    let start = Instant::now();
    while c.stats().held > 0 || c.stats().returned < held {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "never handed back"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The bucket has them again, and the 25 it refilled meanwhile.
    assert_eq!(remaining(&raw, &clock).await, left + 25 + held);
}

#[tokio::test(flavor = "current_thread")]
async fn a_refusal_is_answered_in_process_until_its_time() {
    let Some(mut s) = RedisServer::start("a_refusal_is_answered_in_process_until_its_time") else {
        return;
    };
    let clock = clock();
    let c = client(&s, &clock, Duration::from_secs(3_600)).await;
    // Spend the key until Redis refuses: all the burst but what a refused process waits to
    // lease at once (fewer than k).
    let mut granted = 0;
    let refused = loop {
        match c.check_n("key", 1).await.unwrap() {
            Ok(()) => granted += 1,
            Err(denied) => break denied,
        }
        settle(std::slice::from_ref(&c)).await;
    };
    assert!(granted > BURST - K && granted <= BURST, "{granted}");
    let until = refused.retry_at().unwrap();
    assert!(until > refused.checked_at());
    let calls = c.stats().redis_calls;
    // Redis gone: until then every check is answered in process, with the same retry time.
    s.kill();
    for step in 0..10 {
        let denied = c.check_n("key", 1).await.unwrap().unwrap_err();
        assert_eq!(denied.retry_at(), Some(until), "step {step}");
        clock.advance((until.saturating_duration_since(refused.checked_at())) / 11);
    }
    assert_eq!(
        c.stats().redis_calls,
        calls,
        "no round trip before the refusal's time"
    );
    // At its time the next check asks Redis again (which is down).
    clock.set(until);
    assert!(
        c.check_n("key", 1).await.is_err(),
        "asked Redis at the refusal's end"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_kill_spends_the_held_lease_and_a_restart_empties_the_bucket() {
    let Some(mut s) =
        RedisServer::start("a_kill_spends_the_held_lease_and_a_restart_empties_the_bucket")
    else {
        return;
    };
    let clock = clock();
    let bare = client(&s, &clock, Duration::from_secs(3_600)).await;
    let gcra = Gcra::new(connect(&s).await, limit(), BURST).unwrap();
    let leased = Leased::builder(gcra)
        .max_lease(K)
        .clock(clock.clone())
        .build()
        .unwrap();
    let fallback = Fallback::builder(leased.clone()).build().unwrap();

    // Warm the fallback's client up to a held lease; the bare one drains `hot`.
    for _ in 0..6 {
        assert!(fallback.check("k").await.unwrap().is_ok());
        settle(std::slice::from_ref(&leased)).await;
    }
    let held = leased.stats().held;
    assert!(held > 0);
    saturate(std::slice::from_ref(&bare), &clock, &mut Grants::default()).await;

    // Killed. Past its cached refusal, the bare client's empty lease needs Redis: its error.
    s.kill();
    clock.advance(Duration::from_millis(u64::from(K) + 1));
    let e = bare.check_n("hot", 1).await.unwrap_err();
    assert!(e.is_outage(), "{e}");
    // The fallback's client still spends its held lease (no Redis needed), then the fallback
    // answers in process.
    for i in 0..held {
        assert!(
            fallback.check("k").await.unwrap().is_ok(),
            "held permit {i}"
        );
    }
    assert_eq!(
        fallback.mode(),
        Mode::Redis,
        "the lease answered, not the fallback"
    );
    let _ = fallback.check("k").await.unwrap();
    assert_eq!(fallback.mode(), Mode::Fallback);

    // Restarted without persistence: every key is gone, so `hot`'s bucket is full again at
    // the same time, where it would have refilled K + 1 permits. A restart hands the fleet one
    // more burst.
    s.restart();
    let start = Instant::now();
    while bare.gcra().ping().await.is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "never reconnected"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut grants = Grants::default();
    saturate(std::slice::from_ref(&bare), &clock, &mut grants).await;
    let hot = grants.total() as u32;
    // All the burst but what a refused process waits to lease at once (fewer than k).
    assert!(
        hot > BURST - K,
        "a restart empties the key: a full burst, not {hot}"
    );
    // The fallback's health check finds Redis back.
    let start = Instant::now();
    while fallback.mode() != Mode::Redis {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "never back on Redis"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_cluster_leases_keys_on_every_master() {
    let Some(c) = RedisCluster::start("a_cluster_leases_keys_on_every_master", 3) else {
        return;
    };
    let urls = c.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let con = turnstile::redis::connect_cluster(&urls).await.unwrap();
    let gcra = Gcra::new(con, Limit::every(Duration::from_secs(60)), 4).unwrap();
    // k = 1: a lease per check, so each key's 4 permits are all granted.
    let leased = Leased::builder(gcra).max_lease(1).build().unwrap();
    for i in 0..60 {
        let key = format!("user-{i}");
        for _ in 0..4 {
            assert!(leased.check_n(&key, 1).await.unwrap().is_ok(), "{key}");
        }
        assert!(leased.check_n(&key, 1).await.unwrap().is_err(), "{key}");
    }
    assert!(leased.stats().errors == 0);
}

#[tokio::test]
async fn bad_input_is_refused_before_any_round_trip() {
    let Some(s) = RedisServer::start("leased_bad_input_is_refused_before_any_round_trip") else {
        return;
    };
    let gcra = || async { Gcra::new(connect(&s).await, limit(), BURST).unwrap() };
    let l = Leased::builder(gcra().await).build().unwrap();
    assert_eq!(l.max_lease(), BURST / 8);
    assert!(matches!(
        l.check_n("", 1).await,
        Err(RedisLimitError::EmptyKey)
    ));
    let long = "x".repeat(513);
    assert!(matches!(
        l.check_n(&long, 1).await,
        Err(RedisLimitError::KeyTooLong { .. })
    ));
    assert!(matches!(
        l.check_n("k", BURST + 1).await,
        Err(RedisLimitError::ExceedsBurst { .. })
    ));
    assert_eq!(l.stats().redis_calls, 0);
    assert_eq!(
        Leased::builder(gcra().await)
            .max_lease(BURST + 1)
            .build()
            .err(),
        Some(ConfigError::LeaseExceedsBurst {
            lease: BURST + 1,
            burst: BURST
        })
    );
    assert_eq!(
        Leased::builder(gcra().await).max_lease(0).build().err(),
        Some(ConfigError::ZeroCapacity)
    );
    assert_eq!(
        Leased::builder(gcra().await)
            .horizon(Duration::ZERO)
            .build()
            .err(),
        Some(ConfigError::ZeroPeriod)
    );
    // A key flood beyond the map's bound is checked by plain round trips, not stored.
    let small = Leased::builder(gcra().await).max_keys(4).build().unwrap();
    for i in 0..50 {
        assert!(small
            .check_n(&format!("flood-{i}"), 1)
            .await
            .unwrap()
            .is_ok());
    }
    assert!(small.stats().redis_calls >= 50);
    let _ = RedisLimiter::max_key_len(&small);
}

/// Stress: 3 clients × 8 tasks on a multi-thread runtime spend one key's leases at once while
/// a task per client keeps handing that client's lease back, at a frozen time, so that the
/// budget is exactly the burst and every permit must be accounted for: admitted + held + left
/// in the bucket = the burst, whatever the interleaving of spends, background and foreground
/// renewals and releases. Each client starts holding a lease (warmed one check at a time), and
/// one hands a lease back before the race, so a return always happens.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_spends_and_releases_account_for_every_permit() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    let Some(s) = RedisServer::start("concurrent_spends_and_releases_account_for_every_permit")
    else {
        return;
    };
    let clock = clock();
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(client(&s, &clock, Duration::from_secs(3_600)).await);
    }
    let admitted = Arc::new(AtomicU64::new(0));
    let warm = |c: Client| {
        let admitted = admitted.clone();
        async move {
            while c.stats().held < 4 {
                assert!(c.check_n("hot", 1).await.unwrap().is_ok());
                admitted.fetch_add(1, Ordering::Relaxed);
                settle(std::slice::from_ref(&c)).await;
            }
        }
    };
    warm(clients[0].clone()).await;
    assert!(clients[0].release().await.unwrap() >= 4);
    for c in &clients {
        warm(c.clone()).await;
    }
    let start = Arc::new(tokio::sync::Barrier::new(3 * 9));
    let done = Arc::new(AtomicBool::new(false));
    let mut spenders = Vec::new();
    let mut releasers = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        for t in 0..8u32 {
            let (c, admitted, start) = (c.clone(), admitted.clone(), start.clone());
            spenders.push(tokio::spawn(async move {
                start.wait().await;
                for j in 0..300u32 {
                    let n = 1 + (i as u32 + t + j) % 2;
                    if c.check_n("hot", n).await.unwrap().is_ok() {
                        admitted.fetch_add(u64::from(n), Ordering::Relaxed);
                    }
                    if j % 8 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
            }));
        }
        let (c, start, done) = (c.clone(), start.clone(), done.clone());
        releasers.push(tokio::spawn(async move {
            start.wait().await;
            while !done.load(Ordering::Relaxed) {
                c.release().await.unwrap();
                tokio::task::yield_now().await;
            }
        }));
    }
    for t in spenders {
        t.await.unwrap();
    }
    done.store(true, Ordering::Relaxed);
    for t in releasers {
        t.await.unwrap();
    }
    settle(&clients).await;
    let admitted = admitted.load(Ordering::Relaxed);
    let held: u64 = clients.iter().map(|c| c.stats().held).sum();
    let raw = connect(&s).await;
    let left = remaining(&raw, &clock).await;
    assert!(
        admitted <= u64::from(BURST),
        "{admitted} admitted at a frozen time"
    );
    assert_eq!(
        admitted + held + left,
        u64::from(BURST),
        "{admitted} + {held} + {left}"
    );
    assert!(
        admitted > u64::from(BURST) / 2,
        "the race spent the bucket: {admitted}"
    );
}
