//! Batches of the go-zero compatible Redis limiters, `turnstile::redis::TokenBucket` and
//! `turnstile::redis::FixedWindow`, against a real redis-server of each test's own: a batch
//! (called directly, and forced through `Coalesce` with the server stopped by SIGSTOP while
//! checks queue) decides exactly what the same requests decide one by one and leaves the same
//! state; the token bucket's batch script, on a batch of one, answers and stores what
//! go-zero's own script text does.
#![cfg(feature = "redis")]

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::redis_server::RedisServer;
use common::redis_shared::{patient, patient_connection};
use redis::aio::ConnectionLike;
use turnstile::redis::token_bucket::{BATCH_SCRIPT, SCRIPT};

use crate::token_bucket::{keys, ttl};
use turnstile::redis::{
    Coalesce, Connection, FixedWindow, RedisBatch, RedisLimitError, RedisLimiter, TokenBucket,
};
use turnstile::{Denied, Outcome};

/// go-zero's `core/limit/tokenscript.lua`, verbatim (tests/data/go-zero/README.md).
const GO_ZERO_TOKEN_SCRIPT: &str = include_str!("../data/go-zero/tokenscript.lua");

/// A window on go-zero's keys (no prefix), so the tests read the keys go-zero names.
fn go_zero_window(con: &Connection, quota: u32) -> FixedWindow {
    FixedWindow::builder(quota, HOUR)
        .prefix("")
        .build(con.clone())
        .unwrap()
}

async fn manager(s: &RedisServer) -> Connection {
    turnstile::redis::connect_with(&s.url(), &patient_connection())
        .await
        .expect("connect")
}

/// A small deterministic generator (xorshift), so a failure replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// In `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// A verdict as comparable data: `Ok(())`, or the denial's retry-after.
fn shape(v: &Result<(), Denied>) -> Result<(), Option<Duration>> {
    v.as_ref().map(|_| ()).map_err(Denied::retry_after)
}

/// Tokens and timestamp of a token bucket's key pair, and each key's TTL in seconds.
async fn bucket_state<C: ConnectionLike>(
    con: &mut C,
    k: &[String; 2],
) -> (Option<i64>, Option<i64>, i64, i64) {
    redis::pipe()
        .get(&k[0])
        .get(&k[1])
        .ttl(&k[0])
        .ttl(&k[1])
        .query_async(con)
        .await
        .unwrap()
}

/// A window's counter and remaining TTL in ms (-2: no key, -1: no TTL).
async fn window_state(con: &mut Connection, key: &str) -> (Option<i64>, i64) {
    redis::pipe()
        .get(key)
        .pttl(key)
        .query_async(con)
        .await
        .unwrap()
}

/// Waits (yielding to the runtime) until `c` shows `want` in its stats, failing after 20 s.
async fn until<L: RedisBatch + 'static>(
    c: &Coalesce<L>,
    want: impl Fn(turnstile::redis::CoalesceStats) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !want(c.stats()) {
        assert!(Instant::now() < deadline, "{:?}", c.stats());
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The server stopped, `ns` are checked on `key` through `c`, each task spawned once the
/// previous check is in flight (the first) or queued (the rest), so the batch's order is
/// known; then the server resumes. The verdicts in order, and one batch: exactly 2 calls.
async fn forced_batch<L: RedisBatch + 'static>(
    s: &RedisServer,
    c: &Arc<Coalesce<L>>,
    key: &'static str,
    ns: &[u32],
) -> Vec<Result<(), Denied>> {
    s.pause();
    let mut tasks = Vec::new();
    for (i, &n) in ns.iter().enumerate() {
        let c2 = c.clone();
        tasks.push(tokio::spawn(async move { c2.try_check_n(key, n).await }));
        if i == 0 {
            until(c, |st| st.calls == 1).await;
        } else {
            until(c, |st| st.queued == i as u64).await;
        }
    }
    s.resume();
    let mut verdicts = Vec::new();
    for t in tasks {
        let v = tokio::time::timeout(Duration::from_secs(20), t)
            .await
            .expect("answered within 20 s")
            .unwrap()
            .expect("no infrastructure error");
        verdicts.push(v);
    }
    let st = c.stats();
    assert_eq!(
        (st.checks, st.calls, st.queued),
        (ns.len() as u64, 2, 0),
        "one call for the first check, one batch for the rest: {st:?}"
    );
    verdicts
}

/// Request sizes: 15 per 7 requests (prefix sums 3 4 6 10 11 14 15 18 19 21 25 26 29 30 33
/// 34 …), mixed so that a large request can be denied before a smaller one passes.
fn sizes(count: usize) -> Vec<u32> {
    (0..count).map(|i| [3, 1, 2, 4, 1, 3, 1][i % 7]).collect()
}

// ---------------------------------------------------------------------------------------
// TokenBucket
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn token_bucket_batch_decides_and_stores_what_one_by_one_calls_do() {
    let Some(s) =
        RedisServer::start("token_bucket_batch_decides_and_stores_what_one_by_one_calls_do")
    else {
        return;
    };
    let mut con = manager(&s).await;

    // A hand-made case first: rate 1, burst 20, all at one second.
    let tb = TokenBucket::new(con.clone(), 1, 20).unwrap();
    let now = 1_700_000_000;
    // Full 20: 7 (13 left), 5 (8), 6 (2), 4 denied, 1 (1), 2 denied, 0, 1 (0), 1 denied.
    let ns = [7, 5, 6, 4, 1, 2, 0, 1, 1];
    let batch = tb.try_check_batch_at("batch", now, &ns).await.unwrap();
    let mut alone = Vec::new();
    for &n in &ns {
        alone.push(tb.try_check_n_at("alone", now, n).await.unwrap());
    }
    let (b, a): (Vec<_>, Vec<_>) = (
        batch.iter().map(shape).collect(),
        alone.iter().map(shape).collect(),
    );
    assert_eq!(b, a);
    let granted: Vec<bool> = b.iter().map(Result::is_ok).collect();
    assert_eq!(
        granted,
        [true, true, true, false, true, false, true, true, false]
    );
    // A denial followed by the grant of a smaller request, inside one batch.
    assert!(granted.windows(2).any(|w| !w[0] && w[1]));
    // The retry-afters are the lone calls' (4 needs 2 more tokens: 2 s at rate 1).
    assert_eq!(b[3], Err(Some(Duration::from_secs(2))));
    assert_eq!(
        bucket_state(&mut con, &tb.keys("batch")).await,
        bucket_state(&mut con, &tb.keys("alone")).await
    );
    assert_eq!(
        bucket_state(&mut con, &tb.keys("batch")).await,
        (Some(0), Some(now as i64), 40, 40)
    );
    // An empty batch sends nothing.
    assert!(tb
        .try_check_batch_at("batch", now, &[])
        .await
        .unwrap()
        .is_empty());

    // Then random sequences of batches, each at its own second (refills between them, the
    // clock sometimes stepping back: D13), with D12 limits (rate > 2 × burst) among them.
    let mut rng = Rng(0x6a7c_0e55);
    let (mut batches, mut denied_then_granted, mut d12, mut back) = (0, 0, 0, 0);
    for case in 0..60u32 {
        let rate = rng.range(1, 12) as u32;
        let burst = rng.range(1, 12) as u32;
        if 2 * burst < rate {
            d12 += 1;
        }
        let tb = TokenBucket::new(con.clone(), rate, burst).unwrap();
        let (kb, ka) = (format!("b{case}"), format!("a{case}"));
        let mut now = rng.range(1_000, 1_000_000);
        for step in 0..8 {
            now = match rng.range(0, 5) {
                0 | 1 => now,
                2 | 3 => now + rng.range(1, 3),
                _ => {
                    back += 1;
                    now - rng.range(1, 2)
                }
            };
            let len = rng.range(1, 10) as usize;
            let ns: Vec<u32> = (0..len)
                .map(|_| rng.range(0, u64::from(burst)) as u32)
                .collect();
            let at =
                format!("case {case} (rate {rate}, burst {burst}) step {step} at {now}: {ns:?}");
            let batch: Vec<_> = tb
                .try_check_batch_at(&kb, now, &ns)
                .await
                .unwrap()
                .iter()
                .map(shape)
                .collect();
            let mut alone = Vec::new();
            for &n in &ns {
                alone.push(shape(&tb.try_check_n_at(&ka, now, n).await.unwrap()));
            }
            assert_eq!(batch, alone, "{at}");
            assert_eq!(
                bucket_state(&mut con, &tb.keys(&kb)).await,
                bucket_state(&mut con, &tb.keys(&ka)).await,
                "{at}"
            );
            batches += 1;
            if batch.windows(2).any(|w| w[0].is_err() && w[1].is_ok()) {
                denied_then_granted += 1;
            }
        }
    }
    eprintln!(
        "{batches} batches, {denied_then_granted} with a denial then a grant, {d12} D12 limits, \
         {back} steps back"
    );
    assert!(denied_then_granted >= 20 && d12 >= 5 && back >= 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_bucket_forced_coalesced_batch_matches_one_by_one() {
    let Some(s) = RedisServer::start("token_bucket_forced_coalesced_batch_matches_one_by_one")
    else {
        return;
    };
    let mut con = manager(&s).await;
    const BURST: u32 = 31;
    let tb = TokenBucket::new(con.clone(), 1, 64).unwrap();
    // Coalesce decides at the system clock. Both keys start with 31 tokens and a stored
    // timestamp 100 s ahead of it, so no second passing during the test refills anything
    // (a clock behind the stored timestamp by at most ttl + 1 = 129 s refills nothing and
    // keeps it: D13).
    let ahead = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 100;
    for key in ["batched", "alone"] {
        let [tokens, ts] = tb.keys(key);
        let _: () = redis::pipe()
            .set(&tokens, BURST)
            .set(&ts, ahead)
            .query_async(&mut con)
            .await
            .unwrap();
    }
    let c = Arc::new(patient(tb));
    tb_warm_up(c.limiter()).await;
    // Prefix sums 3 … 30: the 15th request (3) is denied, the 16th (1) takes the last token.
    let ns = sizes(40);
    let batched: Vec<bool> = forced_batch(&s, &c, "batched", &ns)
        .await
        .iter()
        .map(Result::is_ok)
        .collect();
    let mut alone = Vec::new();
    for &n in &ns {
        alone.push(c.limiter().try_check_n("alone", n).await.unwrap().is_ok());
    }
    assert_eq!(batched, alone);
    let granted: u32 = ns.iter().zip(&alone).filter(|p| *p.1).map(|p| *p.0).sum();
    assert_eq!(granted, BURST, "the tokens are used up exactly");
    assert!(
        !alone[14] && alone[15],
        "a denial then a smaller grant: {alone:?}"
    );
    let (b, a) = (
        bucket_state(&mut con, &c.limiter().keys("batched")).await,
        bucket_state(&mut con, &c.limiter().keys("alone")).await,
    );
    assert_eq!((b.0, b.1), (Some(0), Some(ahead as i64)));
    assert_eq!(b, a);
}

/// Loads both scripts, so that the forced batch's calls are not slowed by `NOSCRIPT`.
async fn tb_warm_up(tb: &TokenBucket) {
    tb.try_check_n_at("warm-up", 1, 0).await.unwrap().unwrap();
    tb.try_check_batch_at("warm-up", 1, &[0]).await.unwrap();
}

/// `EVAL` of `script` on `k` with `ARGV = [rate, burst, now, ns…]`, its reply as integers
/// (go-zero's `false` is a nil: an empty list).
async fn eval<C: ConnectionLike>(
    con: &mut C,
    script: &str,
    k: &[String; 2],
    args: (u32, u32, u64),
    ns: &[u32],
) -> Vec<i64> {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(script)
        .arg(2)
        .arg(&k[0])
        .arg(&k[1])
        .arg(args.0)
        .arg(args.1)
        .arg(args.2);
    for &n in ns {
        cmd.arg(n);
    }
    let reply: redis::Value = cmd.query_async(con).await.unwrap();
    match reply {
        redis::Value::Nil => Vec::new(),
        redis::Value::Int(i) => vec![i],
        redis::Value::Array(items) => items
            .into_iter()
            .map(|v| match v {
                redis::Value::Int(i) => i,
                other => panic!("not an integer: {other:?}"),
            })
            .collect(),
        other => panic!("unexpected reply {other:?}"),
    }
}

#[tokio::test]
async fn token_bucket_batch_of_one_is_go_zeros_script() {
    let Some(s) = RedisServer::start("token_bucket_batch_of_one_is_go_zeros_script") else {
        return;
    };
    let mut con = manager(&s).await;
    let mut rng = Rng(0x5eed_b47c);
    let (mut steps, mut denials, mut fresh) = (0, 0, 0);
    for case in 0..40u32 {
        // No D12 (2 × burst ≥ rate) and a clock that never steps back (no D13): where
        // go-zero's script works as meant, the batch script must be it.
        let rate = rng.range(1, 10) as u32;
        let burst = rng.range(rate.div_ceil(2).into(), 12) as u32;
        let args = |now| (rate, burst, now);
        let (kb, kg, ks) = (
            keys("", &format!("batch{case}")),
            keys("", &format!("gozero{case}")),
            keys("", &format!("script{case}")),
        );
        let mut now = rng.range(1_000, 1_000_000);
        for step in 0..25 {
            let idle = [0, 0, 0, 1, 1, 2, 5][rng.range(0, 6) as usize];
            now += idle;
            // Now and then a pair loses a key, or both (expiry, a flush): all three alike.
            // Idle for longer than the TTL, both have expired, as on a real clock.
            let lost = if idle > ttl(rate, burst) {
                0
            } else {
                rng.range(0, 9)
            };
            match lost {
                0 => {
                    for k in [&kb, &kg, &ks] {
                        let _: () = redis::cmd("DEL")
                            .arg(&k[0])
                            .arg(&k[1])
                            .query_async(&mut con)
                            .await
                            .unwrap();
                    }
                    fresh += 1;
                }
                1 => {
                    let which = rng.range(0, 1) as usize;
                    for k in [&kb, &kg, &ks] {
                        let _: () = redis::cmd("DEL")
                            .arg(&k[which])
                            .query_async(&mut con)
                            .await
                            .unwrap();
                    }
                }
                _ => {}
            }
            let n = rng.range(0, u64::from(burst) + 1) as u32;
            let at = format!("case {case} (rate {rate}, burst {burst}) step {step} at {now}: {n}");
            let batch = eval(&mut con, BATCH_SCRIPT, &kb, args(now), &[n]).await;
            let go_zero = eval(&mut con, GO_ZERO_TOKEN_SCRIPT, &kg, args(now), &[n]).await;
            let single = eval(&mut con, SCRIPT, &ks, args(now), &[n]).await;
            assert_eq!(batch.len(), 3, "{at}: {batch:?}");
            // go-zero answers its boolean: 1 or nil.
            let allowed = go_zero == [1];
            assert!(allowed || go_zero.is_empty(), "{at}: {go_zero:?}");
            assert_eq!(batch[0] == 1, allowed, "{at}: go-zero's verdict");
            assert_eq!(batch, single, "{at}: SCRIPT's reply");
            let state = bucket_state(&mut con, &kb).await;
            assert_eq!(
                state,
                bucket_state(&mut con, &kg).await,
                "{at}: go-zero's state"
            );
            assert_eq!(
                state,
                bucket_state(&mut con, &ks).await,
                "{at}: SCRIPT's state"
            );
            assert_eq!((state.0, state.1), (Some(batch[1]), Some(batch[2])), "{at}");
            steps += 1;
            denials += u32::from(!allowed);
        }
    }
    eprintln!("{steps} steps, {denials} denials, {fresh} from missing keys");
    assert!(denials >= 100 && fresh >= 50);
    // An empty batch writes nothing.
    let k = keys("", "empty");
    assert!(eval(&mut con, BATCH_SCRIPT, &k, (1, 1, 5), &[])
        .await
        .is_empty());
    assert_eq!(bucket_state(&mut con, &k).await, (None, None, -2, -2));
}

#[tokio::test]
async fn token_bucket_bad_input_refuses_the_whole_batch() {
    let Some(s) = RedisServer::start("token_bucket_bad_input_refuses_the_whole_batch") else {
        return;
    };
    let mut con = manager(&s).await;
    let tb = TokenBucket::new(con.clone(), 1, 3).unwrap();
    assert!(matches!(
        tb.try_check_batch_at("k", 100, &[1, 4]).await,
        Err(RedisLimitError::ExceedsBurst { n: 4, burst: 3 })
    ));
    assert!(matches!(
        tb.try_check_batch_at("", 100, &[1]).await,
        Err(RedisLimitError::EmptyKey)
    ));
    assert_eq!(
        bucket_state(&mut con, &tb.keys("k")).await,
        (None, None, -2, -2)
    );
    // The trait's validate is the single check's.
    assert!(matches!(
        RedisBatch::validate(&tb, "k", 4),
        Err(RedisLimitError::ExceedsBurst { n: 4, burst: 3 })
    ));
    assert!(matches!(
        RedisBatch::validate(&tb, "", 1),
        Err(RedisLimitError::EmptyKey)
    ));
    assert!(RedisBatch::validate(&tb, "k", 3).is_ok());
}

// ---------------------------------------------------------------------------------------
// FixedWindow
// ---------------------------------------------------------------------------------------

const HOUR: Duration = Duration::from_secs(3600);

/// Whether `pttl` is what a TTL of `secs` set within the last second has left.
fn about(pttl: i64, secs: u64) -> bool {
    let full = secs as i64 * 1000;
    pttl <= full && pttl > full - 1000
}

#[tokio::test]
async fn fixed_window_batch_decides_and_stores_what_one_by_one_takes_do() {
    let Some(s) =
        RedisServer::start("fixed_window_batch_decides_and_stores_what_one_by_one_takes_do")
    else {
        return;
    };
    let mut con = manager(&s).await;
    use Outcome::{Allowed, HitQuota, OverQuota};

    // Quota 10, an hour's window: counts 2 6 7 10 (the quota) 10 (n = 0) 12 13.
    let w = go_zero_window(&con, 10);
    let ns = [2, 4, 1, 3, 0, 2, 1];
    let batch = w.take_batch("batch", &ns).await.unwrap();
    let mut alone = Vec::new();
    for &n in &ns {
        alone.push(w.take_n("alone", n).await.unwrap());
    }
    assert_eq!(batch, alone);
    // The quota is hit and passed inside one batch.
    assert_eq!(
        batch,
        [Allowed, Allowed, Allowed, HitQuota, Allowed, OverQuota, OverQuota]
    );
    let (b, a) = (
        window_state(&mut con, &w.redis_key("batch")).await,
        window_state(&mut con, &w.redis_key("alone")).await,
    );
    assert_eq!((b.0, a.0), (Some(13), Some(13)), "every request counts");
    assert!(about(b.1, 3600) && about(a.1, 3600), "{b:?} {a:?}");
    // A later batch on a window already over quota: all over, the TTL untouched.
    let batch = w.take_batch("batch", &[1, 0, 5]).await.unwrap();
    let mut alone = Vec::new();
    for n in [1, 0, 5] {
        alone.push(w.take_n("alone", n).await.unwrap());
    }
    assert_eq!(batch, alone);
    assert_eq!(batch, [OverQuota, Allowed, OverQuota]);
    assert_eq!(window_state(&mut con, "batch").await.0, Some(19));
    assert_eq!(window_state(&mut con, "alone").await.0, Some(19));

    // The first hit gives the window its TTL: an aligned window, opened at an explicit
    // time 1234 s before the hour's end; a batch led by n = 0 requests opens it as the
    // first nonzero take does, and a batch of zeros sends nothing.
    let w = FixedWindow::builder(5, HOUR)
        .prefix("")
        .align_utc()
        .build(con.clone())
        .unwrap();
    let now = 1_700_000_000 / 3600 * 3600 + 3600 - 1234;
    assert!(w.take_batch_at("zeros", &[0, 0], now).await.unwrap() == [Allowed, Allowed]);
    assert_eq!(window_state(&mut con, "zeros").await, (None, -2));
    let ns = [0, 1, 4, 2];
    let batch = w.take_batch_at("batch-al", &ns, now).await.unwrap();
    let mut alone = Vec::new();
    for &n in &ns {
        alone.push(w.take_n_at("alone-al", n, now).await.unwrap());
    }
    assert_eq!(batch, alone);
    assert_eq!(batch, [Allowed, Allowed, HitQuota, OverQuota]);
    let (b, a) = (
        window_state(&mut con, "batch-al").await,
        window_state(&mut con, "alone-al").await,
    );
    assert_eq!((b.0, a.0), (Some(7), Some(7)));
    assert!(about(b.1, 1234) && about(a.1, 1234), "{b:?} {a:?}");

    // A counter some other writer left without a TTL: the batch gives it one, as the
    // first lone take does, and counts on from it.
    for key in ["batch-nt", "alone-nt"] {
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg(4)
            .query_async(&mut con)
            .await
            .unwrap();
    }
    let w = go_zero_window(&con, 5);
    let batch = w.take_batch("batch-nt", &[1, 1]).await.unwrap();
    let alone = [
        w.take("alone-nt").await.unwrap(),
        w.take("alone-nt").await.unwrap(),
    ];
    assert_eq!(batch, alone);
    assert_eq!(batch, [HitQuota, OverQuota]);
    let (b, a) = (
        window_state(&mut con, "batch-nt").await,
        window_state(&mut con, "alone-nt").await,
    );
    assert_eq!((b.0, a.0), (Some(6), Some(6)));
    assert!(about(b.1, 3600) && about(a.1, 3600), "{b:?} {a:?}");

    // Random batches against random counts already in the window.
    let mut rng = Rng(0xf1_4ed0);
    let mut crossings = 0;
    for case in 0..100u32 {
        let quota = rng.range(1, 20) as u32;
        let w = go_zero_window(&con, quota);
        let (kb, ka) = (format!("rb{case}"), format!("ra{case}"));
        let before = rng.range(0, 2 * u64::from(quota));
        if before > 0 {
            w.take_batch(&kb, &[before as u32 / 2, before.div_ceil(2) as u32])
                .await
                .unwrap();
            let _ = w.take_n(&ka, before as u32 / 2).await.unwrap();
            let _ = w.take_n(&ka, before.div_ceil(2) as u32).await.unwrap();
        }
        let len = rng.range(1, 8) as usize;
        let ns: Vec<u32> = (0..len)
            .map(|_| rng.range(0, u64::from(quota).min(4)) as u32)
            .collect();
        let batch = w.take_batch(&kb, &ns).await.unwrap();
        let mut alone = Vec::new();
        for &n in &ns {
            alone.push(w.take_n(&ka, n).await.unwrap());
        }
        assert_eq!(
            batch, alone,
            "case {case}: quota {quota}, {before} before, {ns:?}"
        );
        let (b, a) = (
            window_state(&mut con, &kb).await,
            window_state(&mut con, &ka).await,
        );
        assert_eq!(b.0, a.0, "case {case}");
        assert_eq!(b.1 < 0, a.1 < 0, "case {case}: {b:?} {a:?}");
        if batch.contains(&HitQuota) && batch.contains(&OverQuota) {
            crossings += 1;
        }
    }
    eprintln!("{crossings} random batches crossed from HitQuota to OverQuota");
    assert!(crossings >= 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_window_forced_coalesced_batch_matches_one_by_one() {
    let Some(s) = RedisServer::start("fixed_window_forced_coalesced_batch_matches_one_by_one")
    else {
        return;
    };
    let mut con = manager(&s).await;
    // Prefix sums 3 … 29 30 33: the 14th request reaches the quota of 30 (HitQuota, still
    // granted) and every later one is over it (denied, and still counted).
    const QUOTA: u32 = 30;
    let w = go_zero_window(&con, QUOTA);
    let _ = w.status("warm-up").await.unwrap();
    let _ = w.take_n("warm-up", 1).await.unwrap();
    let c = Arc::new(patient(w));
    let ns = sizes(30);
    let batched = forced_batch(&s, &c, "batched", &ns).await;
    let mut alone = Vec::new();
    for &n in &ns {
        alone.push(c.limiter().try_check_n("alone", n).await.unwrap());
    }
    let ok = |v: &[Result<(), Denied>]| v.iter().map(Result::is_ok).collect::<Vec<_>>();
    assert_eq!(ok(&batched), ok(&alone));
    assert!(
        ok(&alone)[..14].iter().all(|&g| g),
        "up to the quota: {alone:?}"
    );
    assert!(ok(&alone)[14..].iter().all(|&g| !g), "over it: {alone:?}");
    // A denial says to retry when the window ends: within a second of the hour.
    for d in batched
        .iter()
        .chain(&alone)
        .filter_map(|v| v.as_ref().err())
    {
        let r = d.retry_after().unwrap();
        assert!(r <= HOUR && r > HOUR - Duration::from_secs(5), "{r:?}");
    }
    let total: u32 = ns.iter().sum();
    let (b, a) = (
        window_state(&mut con, &c.limiter().redis_key("batched")).await,
        window_state(&mut con, &c.limiter().redis_key("alone")).await,
    );
    assert_eq!((b.0, a.0), (Some(total.into()), Some(total.into())));
    assert!(about(b.1, 3600) && about(a.1, 3600), "{b:?} {a:?}");
}

#[tokio::test]
async fn fixed_window_bad_input_refuses_the_whole_batch() {
    let Some(s) = RedisServer::start("fixed_window_bad_input_refuses_the_whole_batch") else {
        return;
    };
    let mut con = manager(&s).await;
    let w = go_zero_window(&con, 3);
    assert!(matches!(
        w.take_batch("k", &[1, 4]).await,
        Err(RedisLimitError::ExceedsBurst { n: 4, burst: 3 })
    ));
    assert!(matches!(
        w.take_batch("", &[1]).await,
        Err(RedisLimitError::EmptyKey)
    ));
    assert_eq!(window_state(&mut con, "k").await, (None, -2));
    assert!(w.take_batch("k", &[]).await.unwrap().is_empty());
    assert!(matches!(
        RedisBatch::validate(&w, "k", 4),
        Err(RedisLimitError::ExceedsBurst { n: 4, burst: 3 })
    ));
    assert!(matches!(
        RedisBatch::validate(&w, "", 1),
        Err(RedisLimitError::EmptyKey)
    ));
    assert!(RedisBatch::validate(&w, "k", 3).is_ok());
}
