//! `turnstile::redis::TokenBucket` against real redis-servers: go-zero's TokenLimiter vectors
//! (seed-semantics §4.3), go-zero's own script text (tests/data/go-zero/tokenscript.lua) run
//! side by side on the same server, a Go-style writer sharing a key with the Rust limiter,
//! four clients sharing one limit, expiry, bad input, NOSCRIPT reloads and a 3-master cluster
//! with a slot migration. Each test starts its own server(s).
#![cfg(feature = "redis")]

use crate::common;
use crate::gcra::Counting;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::redis_server::{RedisCluster, RedisServer};
use redis::aio::{ConnectionLike, ConnectionManager};
use turnstile::redis::token_bucket::SCRIPT;
use turnstile::redis::{Fallback, Mode, RedisLimitError, RedisLimiter, StatusVerdict, TokenBucket};
use turnstile::{ConfigError, Denied, Limiter, QuotaStatus};

/// go-zero's key names for `key` under `prefix` (`tokenFormat`, `timestampFormat`), written
/// out here so that the tests pin the format the limiter must use.
pub(crate) fn keys(prefix: &str, key: &str) -> [String; 2] {
    [
        format!("{{{prefix}{key}}}.tokens"),
        format!("{{{prefix}{key}}}.ts"),
    ]
}

/// The keys' TTL the limiter uses for a limit, through its public getter.
pub(crate) fn ttl(rate: u32, burst: u32) -> u64 {
    TokenBucket::new((), rate, burst).unwrap().ttl()
}

/// go-zero's `core/limit/tokenscript.lua`, verbatim.
const GO_ZERO: &str = include_str!("../data/go-zero/tokenscript.lua");

async fn manager(s: &RedisServer) -> ConnectionManager {
    redis::Client::open(s.url())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap()
}

/// go-zero's script by `EVAL` on `keys`: `Ok(true)` for its `true` (1), `Ok(false)` for its
/// `false` (a nil reply), or Redis's error.
async fn go_zero<C: ConnectionLike>(
    con: &mut C,
    keys: &[String; 2],
    rate: u32,
    burst: u32,
    now: u64,
    n: u32,
) -> redis::RedisResult<bool> {
    let r: Option<i64> = redis::cmd("EVAL")
        .arg(GO_ZERO)
        .arg(2)
        .arg(&keys[0])
        .arg(&keys[1])
        .arg(rate)
        .arg(burst)
        .arg(now)
        .arg(n)
        .query_async(con)
        .await?;
    match r {
        Some(1) => Ok(true),
        None => Ok(false),
        Some(other) => panic!("go-zero's script answered {other}"),
    }
}

/// What a key pair holds: tokens, timestamp and both TTLs (seconds; -2 when missing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stored {
    tokens: Option<i64>,
    ts: Option<i64>,
    ttl_tokens: i64,
    ttl_ts: i64,
}

async fn stored<C: ConnectionLike>(con: &mut C, keys: &[String; 2]) -> Stored {
    let (tokens, ts, ttl_tokens, ttl_ts): (Option<i64>, Option<i64>, i64, i64) = redis::pipe()
        .get(&keys[0])
        .get(&keys[1])
        .ttl(&keys[0])
        .ttl(&keys[1])
        .query_async(con)
        .await
        .unwrap();
    Stored {
        tokens,
        ts,
        ttl_tokens,
        ttl_ts,
    }
}

fn full(tokens: i64, ts: i64, ttl: i64) -> Stored {
    Stored {
        tokens: Some(tokens),
        ts: Some(ts),
        ttl_tokens: ttl,
        ttl_ts: ttl,
    }
}

const MISSING: Stored = Stored {
    tokens: None,
    ts: None,
    ttl_tokens: -2,
    ttl_ts: -2,
};

/// go-zero's script semantics in Rust (seed-semantics §4.3), `fixed` with D12 and D13 or as
/// upstream. `Err(())` where upstream's SETEX fails (ttl 0): nothing is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Model {
    state: Option<(i64, i64)>,
}

impl Model {
    fn ttl(rate: u32, burst: u32, fixed: bool) -> i64 {
        let t = (f64::from(burst) / f64::from(rate) * 2.0).floor() as i64;
        if fixed {
            t.max(1)
        } else {
            t
        }
    }

    fn step(&mut self, rate: u32, burst: u32, now: u64, n: u32, fixed: bool) -> Result<bool, ()> {
        let (rate_i, cap, now, n) = (i64::from(rate), i64::from(burst), now as i64, i64::from(n));
        let (last_tokens, last_ts) = self.state.unwrap_or((cap, 0));
        let mut delta = (now - last_ts).max(0);
        let mut ts = now;
        if fixed && self.state.is_some() {
            // D13: kept within ttl + 1 s behind; beyond ttl + 1 s either way, no refill.
            let window = Model::ttl(rate, burst, true) + 1;
            if (now - last_ts).abs() > window {
                delta = 0;
            } else if now < last_ts {
                ts = last_ts;
            }
        }
        let filled = cap.min(last_tokens + delta * rate_i);
        let allowed = filled >= n;
        let new_tokens = if allowed { filled - n } else { filled };
        if Model::ttl(rate, burst, fixed) <= 0 {
            return Err(());
        }
        self.state = Some((new_tokens, ts));
        Ok(allowed)
    }

    fn stored(&self, rate: u32, burst: u32, fixed: bool) -> Stored {
        match self.state {
            None => MISSING,
            Some((tokens, ts)) => full(tokens, ts, Model::ttl(rate, burst, fixed)),
        }
    }
}

/// splitmix64: the tests' deterministic pseudo-random numbers.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

fn verdict(r: Result<Result<(), Denied>, RedisLimitError>) -> Result<(), Denied> {
    r.expect("no infrastructure error")
}

#[tokio::test]
async fn go_zero_vectors_rate_5_burst_10() {
    let Some(s) = RedisServer::start("go_zero_vectors_rate_5_burst_10") else {
        return;
    };
    let mut con = manager(&s).await;
    let tb = TokenBucket::new(con.clone(), 5, 10).unwrap();
    assert_eq!(tb.ttl(), 4);
    let k = tb.keys("vec");
    assert_eq!(k, ["{vec}.tokens".to_string(), "{vec}.ts".to_string()]);
    let twin = keys("", "twin");

    // (now, n, allowed, tokens after, ts after) from §4.3, rows 1–15 (16 and 17 below).
    let mut rows: Vec<(u64, u32, bool, i64, i64)> =
        (1..=10).map(|i| (1000, 1, true, 10 - i, 1000)).collect();
    rows.extend([
        (1000, 1, false, 0, 1000),
        (1001, 1, true, 4, 1001),
        (1001, 6, false, 4, 1001),
        (1001, 5, false, 4, 1001),
        (1003, 10, true, 0, 1003),
    ]);
    for (i, &(now, n, allowed, tokens, ts)) in rows.iter().enumerate() {
        let row = i + 1;
        let got = verdict(tb.try_check_n_at("vec", now, n).await);
        assert_eq!(got.is_ok(), allowed, "row {row}: ({now}, {n})");
        assert_eq!(stored(&mut con, &k).await, full(tokens, ts, 4), "row {row}");
        let gz = go_zero(&mut con, &twin, 5, 10, now, n).await.unwrap();
        assert_eq!(gz, allowed, "row {row}: go-zero's script");
        assert_eq!(
            stored(&mut con, &twin).await,
            full(tokens, ts, 4),
            "row {row}"
        );
        if let Err(d) = got {
            // Tokens left `tokens` at second `ts`; n arrive ceil((n - tokens) / 5) s later.
            let want = ts as u64 + (u64::from(n) - tokens as u64).div_ceil(5) - now;
            assert_eq!(d.retry_after_secs(), Some(want), "row {row}: retry-after");
        }
    }

    // Row 16: n 11 > burst 10. go-zero denies (and rewrites the keys); turnstile refuses it
    // as bad input before any round trip, so the keys are as row 15 left them.
    assert!(matches!(
        tb.try_check_n_at("vec", 1003, 11).await,
        Err(RedisLimitError::ExceedsBurst { n: 11, burst: 10 })
    ));
    assert!(!go_zero(&mut con, &twin, 5, 10, 1003, 11).await.unwrap());
    assert_eq!(stored(&mut con, &k).await, full(0, 1003, 4));
    assert_eq!(stored(&mut con, &twin).await, full(0, 1003, 4));

    // Row 17: a caller at 999, behind the stored 1003. Both deny with tokens 0; go-zero
    // rewinds ts to 999, turnstile keeps 1003 (D13).
    let d = verdict(tb.try_check_n_at("vec", 999, 1).await).unwrap_err();
    assert!(!go_zero(&mut con, &twin, 5, 10, 999, 1).await.unwrap());
    assert_eq!(
        stored(&mut con, &twin).await,
        full(0, 999, 4),
        "go-zero rewinds"
    );
    assert_eq!(
        stored(&mut con, &k).await,
        full(0, 1003, 4),
        "D13: not rewound"
    );
    // The token arrives at 1004 on the stored clock: 5 s after this caller's 999.
    assert_eq!(d.retry_after_secs(), Some(5));
}

#[tokio::test]
async fn go_zero_further_vectors() {
    let Some(s) = RedisServer::start("go_zero_further_vectors") else {
        return;
    };
    let mut con = manager(&s).await;

    // rate 3, burst 4 (ttl 2).
    let tb = TokenBucket::new(con.clone(), 3, 4).unwrap();
    let (k, twin) = (tb.keys("a"), keys("", "twin-a"));
    for (now, n, allowed, tokens) in [
        (1000, 4, true, 0),
        (1000, 1, false, 0),
        (1001, 3, true, 0),
        (1001, 1, false, 0),
    ] {
        assert_eq!(
            verdict(tb.try_check_n_at("a", now, n).await).is_ok(),
            allowed,
            "({now}, {n})"
        );
        assert_eq!(
            go_zero(&mut con, &twin, 3, 4, now, n).await.unwrap(),
            allowed
        );
        assert_eq!(stored(&mut con, &k).await, full(tokens, now as i64, 2));
        assert_eq!(stored(&mut con, &twin).await, full(tokens, now as i64, 2));
    }

    // rate 5, burst 10, fresh keys: n 0 is allowed and writes a full bucket.
    let tb = TokenBucket::new(con.clone(), 5, 10).unwrap();
    let (k, twin) = (tb.keys("b"), keys("", "twin-b"));
    assert!(verdict(tb.try_check_n_at("b", 1000, 0).await).is_ok());
    assert!(go_zero(&mut con, &twin, 5, 10, 1000, 0).await.unwrap());
    assert_eq!(stored(&mut con, &k).await, full(10, 1000, 4));
    assert_eq!(stored(&mut con, &twin).await, full(10, 1000, 4));
    // n 11 on fresh keys: go-zero denies and writes; turnstile refuses it before any
    // round trip and writes nothing.
    let (k, twin) = (tb.keys("c"), keys("", "twin-c"));
    assert!(matches!(
        tb.try_check_n_at("c", 1000, 11).await,
        Err(RedisLimitError::ExceedsBurst { n: 11, burst: 10 })
    ));
    assert!(!go_zero(&mut con, &twin, 5, 10, 1000, 11).await.unwrap());
    assert_eq!(stored(&mut con, &k).await, MISSING);
    assert_eq!(stored(&mut con, &twin).await, full(10, 1000, 4));

    // rate 10, burst 4: go-zero's ttl is 0, SETEX fails and nothing is written; D12's ttl
    // of 1 s makes it work.
    let tb = TokenBucket::new(con.clone(), 10, 4).unwrap();
    assert_eq!(tb.ttl(), 1);
    let (k, twin) = (tb.keys("d"), keys("", "twin-d"));
    let err = go_zero(&mut con, &twin, 10, 4, 1000, 1).await.unwrap_err();
    assert!(
        err.to_string().contains("invalid expire time"),
        "go-zero's error: {err}"
    );
    assert_eq!(stored(&mut con, &twin).await, MISSING);
    assert!(verdict(tb.try_check_n_at("d", 1000, 4).await).is_ok());
    assert_eq!(stored(&mut con, &k).await, full(0, 1000, 1));
    let d = verdict(tb.try_check_n_at("d", 1000, 1).await).unwrap_err();
    assert_eq!(d.retry_after_secs(), Some(1));
    assert!(verdict(tb.try_check_n_at("d", 1001, 4).await).is_ok());
    assert_eq!(stored(&mut con, &k).await, full(0, 1001, 1));
}

/// The limiter and go-zero's own script on twin keys of one server, over pseudo-random
/// configurations and (now, n) sequences, each checked against the Rust model of the script
/// (fixed for turnstile, upstream for go-zero). The two agree on verdicts and on stored
/// tokens, timestamp and TTLs until D12 (2·burst < rate: go-zero's SETEX fails) or D13 (a
/// caller behind the stored timestamp, which go-zero rewinds, or more than ttl + 1 s ahead
/// of it, which go-zero refills) applies, and only then differ.
#[tokio::test]
async fn same_verdicts_and_state_as_go_zeros_script() {
    let Some(s) = RedisServer::start("same_verdicts_and_state_as_go_zeros_script") else {
        return;
    };
    let mut con = manager(&s).await;
    let mut rng = Rng(0x70c4_e751);
    let (mut identical, mut d12, mut d13, mut steps, mut denials) = (0, 0, 0, 0, 0);
    for case in 0..120u32 {
        let rate = rng.range(1, 12) as u32;
        let burst = rng.range(1, 12) as u32;
        // A third of the sequences let the caller's clock step back (D13's case).
        let backwards = case % 3 == 2;
        let tb = TokenBucket::new(con.clone(), rate, burst).unwrap();
        let key = format!("diff:{case}");
        let (k, twin) = (tb.keys(&key), keys("", &format!("twin:{case}")));
        let (mut ours, mut theirs) = (Model::default(), Model::default());
        let mut now = rng.range(1_000, 1_000_000);
        let mut diverged = None;
        for step in 0..30 {
            now = match rng.range(0, 9) {
                0..=4 => now,
                5..=7 => now + 1,
                // Idle for up to 5 s; beyond ttl + 1 s only in the D13 sequences (keys that
                // old have expired on a real clock; their stored timestamp is a wrong one).
                8 if backwards => now + rng.range(2, 5),
                8 => now + rng.range(2, 5).min(ttl(rate, burst) + 1),
                _ if backwards => now.saturating_sub(rng.range(1, 3)),
                _ => now + 1,
            };
            let n = rng.range(0, u64::from(burst)) as u32;
            let at = format!("case {case} (rate {rate}, burst {burst}) step {step}: ({now}, {n})");
            assert_eq!(Model::ttl(rate, burst, true), ttl(rate, burst) as i64);

            if Model::ttl(rate, burst, false) == 0 {
                diverged.get_or_insert("D12");
            } else if ours.state.is_some_and(|(_, ts)| {
                let window = Model::ttl(rate, burst, true) + 1;
                (now as i64) < ts || (now as i64) > ts + window
            }) {
                diverged.get_or_insert("D13");
            }
            let want = ours.step(rate, burst, now, n, true).unwrap();
            let got = verdict(tb.try_check_n_at(&key, now, n).await);
            assert_eq!(got.is_ok(), want, "{at}");
            let got_state = stored(&mut con, &k).await;
            assert_eq!(got_state, ours.stored(rate, burst, true), "{at}");
            if let Err(d) = got {
                denials += 1;
                // The retry-after is exactly when the model first allows the same call.
                let r = d
                    .retry_after_secs()
                    .expect("n <= burst: a retry can succeed");
                assert!(r >= 1, "{at}");
                let mut later = ours;
                assert!(
                    !later.step(rate, burst, now + r - 1, n, true).unwrap(),
                    "{at}"
                );
                let mut later = ours;
                assert!(later.step(rate, burst, now + r, n, true).unwrap(), "{at}");
            }

            let want_gz = theirs.step(rate, burst, now, n, false);
            match (go_zero(&mut con, &twin, rate, burst, now, n).await, want_gz) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "{at}: go-zero"),
                (Err(e), Err(())) => assert!(e.to_string().contains("invalid expire time")),
                (a, b) => panic!("{at}: go-zero's script {a:?}, model {b:?}"),
            }
            let gz_state = stored(&mut con, &twin).await;
            assert_eq!(gz_state, theirs.stored(rate, burst, false), "{at}: go-zero");

            if diverged.is_none() {
                assert_eq!(want_gz, Ok(want), "{at}: same verdict");
                assert_eq!(got_state, gz_state, "{at}: same state");
            }
            steps += 1;
        }
        match diverged {
            None => identical += 1,
            Some("D12") => d12 += 1,
            Some(_) => d13 += 1,
        }
    }
    eprintln!(
        "go-zero differential: {identical} sequences identical to the end, {d12} under D12, \
         {d13} parted at D13; {steps} steps, {denials} denials"
    );
    assert!(identical >= 40 && d12 >= 5 && d13 >= 5 && denials >= 200);
}

/// A clock behind the stored timestamp mints tokens in go-zero (D13) and not here.
#[tokio::test]
async fn a_clock_behind_mints_nothing() {
    let Some(s) = RedisServer::start("a_clock_behind_mints_nothing") else {
        return;
    };
    let mut con = manager(&s).await;
    let tb = TokenBucket::new(con.clone(), 5, 10).unwrap();
    let twin = keys("", "twin");
    // Two callers, one a second behind the other, alternate on a drained bucket.
    assert!(verdict(tb.try_check_n_at("k", 1000, 10).await).is_ok());
    assert!(go_zero(&mut con, &twin, 5, 10, 1000, 10).await.unwrap());
    let (mut granted, mut granted_gz) = (0, 0);
    for _ in 0..5 {
        for now in [999, 1000] {
            granted += 5 * u32::from(verdict(tb.try_check_n_at("k", now, 5).await).is_ok());
            granted_gz += 5 * u32::from(go_zero(&mut con, &twin, 5, 10, now, 5).await.unwrap());
        }
    }
    assert_eq!(granted, 0, "no time passed: nothing to grant");
    assert_eq!(granted_gz, 25, "go-zero refills 5 at each 999 -> 1000 step");
}

/// How a check reaches Redis: [`SCRIPT`] by `try_check_n_at` or by `try_check_n_status_at`,
/// or the batch script (`try_check_batch_at`, 100 checks a round trip).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    Single,
    Status,
    Batch,
}

/// `checks` one-permit checks of `key` at second `now` through `path`: how many passed, and
/// the retry-after of the last denial.
async fn checks_at(
    tb: &TokenBucket<ConnectionManager>,
    key: &str,
    now: u64,
    checks: u32,
    path: Path,
) -> (u32, Option<u64>) {
    let mut verdicts = Vec::new();
    match path {
        Path::Single => {
            for _ in 0..checks {
                verdicts.push(verdict(tb.try_check_n_at(key, now, 1).await));
            }
        }
        Path::Status => {
            for _ in 0..checks {
                let StatusVerdict { result, status } =
                    tb.try_check_n_status_at(key, now, 1).await.unwrap();
                assert!(status.is_some());
                verdicts.push(result);
            }
        }
        Path::Batch => {
            let mut left = checks;
            while left > 0 {
                let len = left.min(100);
                let ns = vec![1; len as usize];
                verdicts.extend(tb.try_check_batch_at(key, now, &ns).await.unwrap());
                left -= len;
            }
        }
    }
    let passed = verdicts.iter().filter(|v| v.is_ok()).count() as u32;
    let retry = verdicts
        .iter()
        .rev()
        .find_map(|v| v.as_ref().err())
        .map(|d| d.retry_after_secs().expect("n <= burst"));
    (passed, retry)
}

/// The row: 100/s with bursts of 200; one caller whose clock is an hour ahead checks
/// once, then callers with the right clock check 1000 times a second. Storing the larger
/// timestamp froze the key for the hour (0 of 1000 a second, retry-after 3590 s); now the
/// hour earns nothing (the ahead call itself is denied on the drained bucket) and the next
/// right-clock call puts the bucket back in the present: it refills nothing for the second
/// it lost, then 100 a second, the limit, on all three scripts' paths alike.
#[tokio::test]
async fn a_clock_an_hour_ahead_once_neither_freezes_the_key_nor_mints() {
    let Some(s) =
        RedisServer::start("a_clock_an_hour_ahead_once_neither_freezes_the_key_nor_mints")
    else {
        return;
    };
    let mut con = manager(&s).await;
    let (rate, burst) = (100u32, 200u32);
    let tb = TokenBucket::new(con.clone(), rate, burst).unwrap();
    const T0: u64 = 1_700_000_000;
    const SECONDS: u64 = 10;
    let mut per_path = Vec::new();
    for path in [Path::Single, Path::Status, Path::Batch] {
        let key = format!("ahead-{path:?}");
        let mut model = Model::default();
        let (drained, _) = checks_at(&tb, &key, T0, 1000, path).await;
        assert_eq!(drained, burst, "{path:?}: a fresh key is a full bucket");
        for _ in 0..1000 {
            model.step(rate, burst, T0, 1, true).unwrap();
        }
        let (ahead, _) = checks_at(&tb, &key, T0 + 3600, 1, path).await;
        model.step(rate, burst, T0 + 3600, 1, true).unwrap();
        let (mut passed, mut modelled, mut retries) = (Vec::new(), Vec::new(), Vec::new());
        for second in 1..=SECONDS {
            let now = T0 + second;
            let (p, retry) = checks_at(&tb, &key, now, 1000, path).await;
            let want = (0..1000)
                .filter(|_| model.step(rate, burst, now, 1, true).unwrap())
                .count() as u32;
            passed.push(p);
            modelled.push(want);
            retries.push(retry);
        }
        assert_eq!(
            passed[1..],
            [rate; SECONDS as usize - 1],
            "{path:?}: the limit in every second after the first"
        );
        let granted = drained + ahead + passed.iter().sum::<u32>();
        assert!(
            granted <= burst + rate * SECONDS as u32,
            "{path:?}: {granted} granted, more than the burst and the rate over {SECONDS} s"
        );
        assert_eq!(ahead, 0, "{path:?}: an hour of skew refills nothing");
        assert_eq!(passed, modelled, "{path:?}: as the model");
        // Each second's last denial: the next second.
        assert_eq!(retries, [Some(1); SECONDS as usize], "{path:?}");
        assert_eq!(
            stored(&mut con, &tb.keys(&key)).await,
            model.stored(rate, burst, true),
            "{path:?}"
        );
        per_path.push(passed);
    }
    assert!(per_path.windows(2).all(|w| w[0] == w[1]), "{per_path:?}");
    eprintln!(
        "an hour ahead once, then 1000 checks a second: {:?}",
        per_path[0]
    );
}

/// A caller an hour behind, once, on a drained bucket: it moves the stored timestamp an hour
/// back (so that it is not frozen itself) but refills nothing, and the right-clock callers
/// after it are not credited the hour either (go-zero's rewind, which mints a bucket).
#[tokio::test]
async fn a_clock_an_hour_behind_once_mints_nothing() {
    let Some(s) = RedisServer::start("a_clock_an_hour_behind_once_mints_nothing") else {
        return;
    };
    let mut con = manager(&s).await;
    let (rate, burst) = (100u32, 200u32);
    let tb = TokenBucket::new(con.clone(), rate, burst).unwrap();
    const T0: u64 = 1_700_000_000;
    for path in [Path::Single, Path::Status, Path::Batch] {
        let key = format!("behind-{path:?}");
        let k = tb.keys(&key);
        assert_eq!(checks_at(&tb, &key, T0, 1000, path).await.0, burst);
        assert_eq!(checks_at(&tb, &key, T0 - 3600, 1, path).await.0, 0);
        assert_eq!(stored(&mut con, &k).await, full(0, (T0 - 3600) as i64, 4));
        // The same second on the right clock: no time has passed, nothing to grant.
        let (p, retry) = checks_at(&tb, &key, T0, 1000, path).await;
        assert_eq!(
            (p, retry),
            (0, Some(1)),
            "{path:?}: the rewound hour is no refill"
        );
        assert_eq!(stored(&mut con, &k).await, full(0, T0 as i64, 4));
        // From then on, the limit.
        for second in 1..=5 {
            let (p, _) = checks_at(&tb, &key, T0 + second, 1000, path).await;
            assert_eq!(p, rate, "{path:?} second {second}");
        }
    }
}

/// Right-clock callers on one key: this limiter alone, or this limiter and go-zero's script
/// taking turns.
struct Fleet<'a> {
    con: ConnectionManager,
    tb: &'a TokenBucket<ConnectionManager>,
    key: &'a str,
    go_in_fleet: bool,
}

impl Fleet<'_> {
    /// 1000 checks at `now`, each compared with the model's verdict: call `i` is this
    /// limiter's, or go-zero's on odd `i` in a mixed fleet (so this limiter's comes first
    /// after a skewed call: go-zero's script, first after a rewind an hour back, would refill
    /// the hour, as it always does). How many passed, and how many differed from the model.
    async fn second(&mut self, model: &mut Model, now: u64) -> (u32, u32) {
        let (rate, burst) = (self.tb.rate(), self.tb.burst());
        let k = self.tb.keys(self.key);
        let (mut passed, mut differed) = (0, 0);
        for i in 0..1000 {
            let go = self.go_in_fleet && i % 2 == 1;
            let got = if go {
                go_zero(&mut self.con, &k, rate, burst, now, 1)
                    .await
                    .unwrap()
            } else {
                verdict(self.tb.try_check_n_at(self.key, now, 1).await).is_ok()
            };
            let want = model.step(rate, burst, now, 1, !go).unwrap();
            differed += u32::from(got != want);
            passed += u32::from(got);
        }
        (passed, differed)
    }
}

/// go-zero's own script (a Go service whose clock is an hour off, once) beside this limiter
/// on the same keys, then a fleet of right clocks at 1000 checks a second: this limiter alone,
/// or this limiter and go-zero's script taking turns. Every call, of either script, is the
/// model's (go-zero's steps upstream's, this limiter's with D13). An hour ahead, go-zero's
/// call is credited the hour (go-zero's own D13: it refills the drained bucket) and stores it;
/// storing the larger timestamp then froze every later call of this limiter for the hour.
/// An hour behind, go-zero's call rewinds the stored timestamp; a refill from it credited the
/// hour to this limiter's next call. Now either way the fleet is back at the limit from the
/// second one and grants nothing for the skew beyond what go-zero's own call refilled.
#[tokio::test]
async fn a_go_service_an_hour_off_beside_rust_services_on_one_key() {
    let Some(s) = RedisServer::start("a_go_service_an_hour_off_beside_rust_services_on_one_key")
    else {
        return;
    };
    let mut con = manager(&s).await;
    let (rate, burst) = (100u32, 200u32);
    let tb = TokenBucket::new(con.clone(), rate, burst).unwrap();
    const T0: u64 = 1_700_000_000;
    const SECONDS: u64 = 6;
    for (skew, off_granted, first_second) in [(3600i64, true, 199), (-3600, false, 0)] {
        for go_in_fleet in [false, true] {
            let at = format!("go-zero {skew:+} s, go-zero in the right fleet: {go_in_fleet}");
            let key = format!("fleet{skew}{go_in_fleet}");
            let k = tb.keys(&key);
            let mut model = Model::default();
            let mut fleet = Fleet {
                con: con.clone(),
                tb: &tb,
                key: &key,
                go_in_fleet,
            };
            assert_eq!(fleet.second(&mut model, T0).await, (burst, 0), "{at}");
            let off = T0.checked_add_signed(skew).unwrap();
            assert_eq!(
                go_zero(&mut con, &k, rate, burst, off, 1).await.unwrap(),
                off_granted
            );
            model.step(rate, burst, off, 1, false).unwrap();
            let (mut passed, mut differed) = (Vec::new(), 0);
            for s in 1..=SECONDS {
                let (p, d) = fleet.second(&mut model, T0 + s).await;
                passed.push(p);
                differed += d;
            }
            let mut want = vec![rate; SECONDS as usize];
            want[0] = first_second;
            assert_eq!(passed, want, "{at}: passed in each second");
            assert_eq!(differed, 0, "{at}: calls that differ from the model");
            assert_eq!(
                stored(&mut con, &k).await,
                model.stored(rate, burst, true),
                "{at}"
            );
            // Beyond go-zero's own refill (199 tokens left by its call an hour ahead), the
            // skew granted nothing: the rate over the seconds since.
            let after_off: u32 = passed.iter().sum();
            let left = if off_granted { burst - 1 } else { 0 };
            assert!(
                after_off <= left + rate * SECONDS as u32,
                "{at}: {passed:?}"
            );
        }
    }
}

/// go-zero's script (a Go service) and the Rust limiter take turns on one key: each sees the
/// other's writes, and together they follow the one model.
#[tokio::test]
async fn a_go_service_and_a_rust_service_share_one_key() {
    let Some(s) = RedisServer::start("a_go_service_and_a_rust_service_share_one_key") else {
        return;
    };
    let mut con = manager(&s).await;
    let mut rng = Rng(11);
    let (mut go_calls, mut rust_calls, mut denials) = (0, 0, 0);
    for case in 0..20u32 {
        let (rate, burst) = (rng.range(1, 8) as u32, rng.range(2, 16) as u32);
        if Model::ttl(rate, burst, false) == 0 {
            continue; // go-zero cannot run these at all (D12)
        }
        // A prefix on the Rust side, the whole key on the Go side, as a fleet would do.
        let tb = TokenBucket::builder(rate, burst)
            .prefix("svc:")
            .build(con.clone())
            .unwrap();
        let key = format!("shared{case}");
        let go_keys = keys("", &format!("svc:{key}"));
        assert_eq!(tb.keys(&key), go_keys);
        let mut model = Model::default();
        let mut now = 5_000;
        for step in 0..40 {
            now += rng.range(0, 2) / 2; // mostly the same second
            let n = rng.range(1, u64::from(burst)) as u32;
            let want = model.step(rate, burst, now, n, true).unwrap();
            let got = if rng.next() & 1 == 0 {
                go_calls += 1;
                go_zero(&mut con, &go_keys, rate, burst, now, n)
                    .await
                    .unwrap()
            } else {
                rust_calls += 1;
                verdict(tb.try_check_n_at(&key, now, n).await).is_ok()
            };
            denials += u32::from(!got);
            assert_eq!(got, want, "case {case} step {step}: ({now}, {n})");
            assert_eq!(
                stored(&mut con, &go_keys).await,
                model.stored(rate, burst, true)
            );
        }
    }
    assert!(go_calls > 200 && rust_calls > 200 && denials > 50);
}

#[tokio::test]
async fn idle_keys_expire_and_start_full() {
    let Some(s) = RedisServer::start("idle_keys_expire_and_start_full") else {
        return;
    };
    let mut con = manager(&s).await;
    for (rate, burst, ttl_s) in [(5u32, 10u32, 4i64), (10, 4, 1), (1, 3, 6)] {
        let tb = TokenBucket::new(con.clone(), rate, burst).unwrap();
        let key = format!("idle{rate}");
        let k = tb.keys(&key);
        assert!(verdict(tb.try_check_n_at(&key, 1000, burst).await).is_ok());
        // A denial refreshes the TTL too, as in go-zero.
        assert!(verdict(tb.try_check_n_at(&key, 1000, 1).await).is_err());
        for key in &k {
            let pttl: i64 = redis::cmd("PTTL")
                .arg(key)
                .query_async(&mut con)
                .await
                .unwrap();
            assert!(pttl > 0 && pttl <= ttl_s * 1000, "{key}: PTTL {pttl}");
        }
        // Let the TTL run out (1 ms instead of seconds).
        for key in &k {
            let _: () = redis::cmd("PEXPIRE")
                .arg(key)
                .arg(1)
                .query_async(&mut con)
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(stored(&mut con, &k).await, MISSING);
        // Same second, yet full again: the idle key is gone.
        assert!(verdict(tb.try_check_n_at(&key, 1000, burst).await).is_ok());
        assert_eq!(stored(&mut con, &k).await, full(0, 1000, ttl_s));
    }
}

/// One key of a pair gone (evicted, or deleted by hand): a missing tokens key reads as a full
/// bucket and a missing timestamp as 0 (a full refill), as in go-zero's script.
#[tokio::test]
async fn half_a_pair_reads_as_go_zero_reads_it() {
    let Some(s) = RedisServer::start("half_a_pair_reads_as_go_zero_reads_it") else {
        return;
    };
    let mut con = manager(&s).await;
    let tb = TokenBucket::new(con.clone(), 1, 10).unwrap();
    let now = 1000;
    for gone in [0, 1] {
        let key = format!("half{gone}");
        let (k, twin) = (tb.keys(&key), keys("", &format!("twin{gone}")));
        assert!(verdict(tb.try_check_n_at(&key, now, 10).await).is_ok());
        assert!(go_zero(&mut con, &twin, 1, 10, now, 10).await.unwrap());
        let _: () = redis::pipe()
            .del(&k[gone])
            .del(&twin[gone])
            .query_async(&mut con)
            .await
            .unwrap();
        // Same second: only the missing key's default can make 10 tokens.
        assert!(verdict(tb.try_check_n_at(&key, now, 10).await).is_ok());
        assert!(go_zero(&mut con, &twin, 1, 10, now, 10).await.unwrap());
        assert_eq!(stored(&mut con, &k).await, full(0, now as i64, 20));
        assert_eq!(stored(&mut con, &twin).await, full(0, now as i64, 20));
    }
}

#[tokio::test]
async fn bad_input_is_a_typed_error_before_any_round_trip() {
    let Some(mut s) = RedisServer::start("bad_input_is_a_typed_error_before_any_round_trip") else {
        return;
    };
    // Few, quick reconnection attempts, so that the dead server's error comes soon.
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_millis(20))
        .set_connection_timeout(Some(Duration::from_millis(200)));
    let con = redis::Client::open(s.url())
        .unwrap()
        .get_connection_manager_with_config(config)
        .await
        .unwrap();
    assert_eq!(
        TokenBucket::new(con.clone(), 0, 10).unwrap_err(),
        ConfigError::ZeroRate
    );
    assert_eq!(
        TokenBucket::new(con.clone(), 10, 0).unwrap_err(),
        ConfigError::ZeroCapacity
    );
    let tb = TokenBucket::new(con.clone(), 5, 10).unwrap();
    tb.ping().await.unwrap();
    s.kill();
    // Bad input needs no server: the typed error, at once.
    let quick = Duration::from_millis(500);
    let r = tokio::time::timeout(quick, tb.try_check_n_at("", 1000, 1)).await;
    assert!(matches!(r, Ok(Err(RedisLimitError::EmptyKey))), "{r:?}");
    let r = tokio::time::timeout(quick, tb.try_check_n("", 1)).await;
    assert!(matches!(r, Ok(Err(RedisLimitError::EmptyKey))), "{r:?}");
    let r = tokio::time::timeout(quick, tb.try_check_n("k", 11)).await;
    assert!(
        matches!(
            r,
            Ok(Err(RedisLimitError::ExceedsBurst { n: 11, burst: 10 }))
        ),
        "{r:?}"
    );
    let r = tokio::time::timeout(quick, tb.try_check_n_at("k", 1000, u32::MAX)).await;
    assert!(
        matches!(r, Ok(Err(RedisLimitError::ExceedsBurst { .. }))),
        "{r:?}"
    );
    // A good call does go to the (dead) server: a connectivity error, not a verdict.
    let r = tokio::time::timeout(Duration::from_secs(10), tb.try_check("k"))
        .await
        .expect("a dead server answers promptly");
    let e = r.expect_err("no server");
    assert!(e.is_connectivity(), "{e:?}");
    let e = tokio::time::timeout(Duration::from_secs(10), tb.ping())
        .await
        .unwrap()
        .unwrap_err();
    assert!(e.is_connectivity(), "{e:?}");
}

/// A key longer than the builder's `max_key_len` is `KeyTooLong` before any round trip, on
/// every path (checks, batches, status checks), and the bound is the configured one: a key
/// at it goes out.
#[tokio::test]
async fn keys_over_a_configured_max_key_len_are_refused_before_any_round_trip() {
    let con = Counting::default();
    let sent = con.0.clone();
    let tb = TokenBucket::builder(5, 10)
        .max_key_len(8)
        .build(con)
        .unwrap();
    assert_eq!(tb.max_key_len(), 8);
    let over = "123456789";
    let too_long = |e: RedisLimitError| {
        assert!(
            matches!(e, RedisLimitError::KeyTooLong { len: 9, max: 8 }),
            "{e:?}"
        );
    };
    too_long(tb.try_check(over).await.unwrap_err());
    too_long(tb.try_check_n(over, 1).await.unwrap_err());
    too_long(tb.try_check_n_at(over, 1000, 1).await.unwrap_err());
    too_long(
        tb.try_check_batch_at(over, 1000, &[1, 2])
            .await
            .unwrap_err(),
    );
    too_long(tb.try_check_n_status(over, 1).await.unwrap_err());
    too_long(tb.try_check_n_status_at(over, 1000, 1).await.unwrap_err());
    assert_eq!(sent.load(Ordering::SeqCst), 0, "nothing was sent");
    // A key at the bound does go out (and fails on this connection as a connectivity error).
    let e = tb.try_check("12345678").await.unwrap_err();
    assert!(e.is_connectivity(), "{e:?}");
    assert!(sent.load(Ordering::SeqCst) > 0);
}

/// The builder's `max_key_len` is 512 bytes unless set, as every Redis limiter's, and so is
/// `new`'s: a key of 513 bytes is refused before any round trip, one of 512 goes out.
#[tokio::test]
async fn the_builders_max_key_len_defaults_to_512() {
    let con = Counting::default();
    let sent = con.0.clone();
    let built = TokenBucket::builder(5, 10).build(con.clone()).unwrap();
    let new = TokenBucket::new(con, 5, 10).unwrap();
    for tb in [built, new] {
        assert_eq!(tb.max_key_len(), 512);
        let before = sent.load(Ordering::SeqCst);
        let e = tb.try_check(&"k".repeat(513)).await.unwrap_err();
        assert!(
            matches!(e, RedisLimitError::KeyTooLong { len: 513, max: 512 }),
            "{e:?}"
        );
        assert_eq!(sent.load(Ordering::SeqCst), before, "nothing was sent");
        let e = tb.try_check(&"k".repeat(512)).await.unwrap_err();
        assert!(e.is_connectivity(), "{e:?}");
        assert!(sent.load(Ordering::SeqCst) > before);
    }
}

/// In a `Fallback`: rate 10, burst 4 (go-zero's ttl 0, its limiter forever in rescue mode)
/// stays on Redis; a dead server is answered in process with the fleet share; a restarted
/// one takes over again.
#[tokio::test]
async fn in_a_fallback_d12_limits_stay_on_redis() {
    let Some(mut s) = RedisServer::start("in_a_fallback_d12_limits_stay_on_redis") else {
        return;
    };
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_max_delay(Duration::from_millis(50))
        .set_connection_timeout(Some(Duration::from_millis(200)));
    let con = redis::Client::open(s.url())
        .unwrap()
        .get_connection_manager_with_config(config)
        .await
        .unwrap();
    let tb = TokenBucket::new(con, 10, 4).unwrap();
    let f = Fallback::builder(tb)
        .timeout(Duration::from_millis(300))
        .fleet_size(2)
        .build()
        .unwrap();
    for _ in 0..20 {
        let _verdict = f.check("k").await.expect("answered by Redis");
    }
    assert_eq!((f.mode(), f.stats().switches_to_fallback), (Mode::Redis, 0));
    assert_eq!(s.cli(&["ttl", "{k}.tokens"]), "1", "D12: a TTL of 1 s");

    s.kill();
    // Answered in process: burst ceil(4 / 2) = 2, 5 a second.
    assert!(f.check("k").await.unwrap().is_ok());
    assert_eq!(f.mode(), Mode::Fallback);
    assert!(f.check("k").await.unwrap().is_ok());
    assert!(f.check("k").await.unwrap().is_err());

    s.restart();
    // The fallback's PING task switches back (polled without blocking the runtime).
    common::back_on_redis(&f).await;
    let _verdict = f.check("k").await.expect("answered by Redis");
    assert_eq!(s.cli(&["exists", "{k}.tokens"]), "1");
}

#[tokio::test]
async fn script_flush_between_calls_reloads_it() {
    let Some(s) = RedisServer::start("script_flush_between_calls_reloads_it") else {
        return;
    };
    let mut con = manager(&s).await;
    let sha = redis::Script::new(SCRIPT).get_hash().to_string();
    let exists = || s.cli(&["script", "exists", &sha]);
    let tb = TokenBucket::new(con.clone(), 1, 3).unwrap();
    assert_eq!(exists(), "0");
    assert!(verdict(tb.try_check_n_at("f", 1000, 1).await).is_ok());
    assert_eq!(exists(), "1", "loaded on first use");
    for (i, left) in [1i64, 0].into_iter().enumerate() {
        assert_eq!(s.cli(&["script", "flush"]), "OK");
        assert_eq!(exists(), "0");
        assert!(
            verdict(tb.try_check_n_at("f", 1000, 1).await).is_ok(),
            "{i}"
        );
        assert_eq!(exists(), "1", "reloaded after SCRIPT FLUSH");
        assert_eq!(stored(&mut con, &tb.keys("f")).await, full(left, 1000, 6));
    }
    s.cli(&["script", "flush"]);
    assert!(verdict(tb.try_check_n_at("f", 1000, 1).await).is_err());
}

/// `try_check_n` reads the system clock in whole Unix seconds, as go-zero's `time.Now()`.
#[tokio::test]
async fn try_check_uses_the_callers_clock_in_whole_seconds() {
    let Some(s) = RedisServer::start("try_check_uses_the_callers_clock_in_whole_seconds") else {
        return;
    };
    let mut con = manager(&s).await;
    let unix = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
    };
    let tb = TokenBucket::new(con.clone(), 1, 2).unwrap();
    let before = unix().as_secs() as i64;
    assert!(verdict(tb.try_check_n("clock", 2).await).is_ok());
    // At most one token can have arrived since: 2 are never there.
    let d = verdict(tb.try_check_n("clock", 2).await).unwrap_err();
    let after = unix();
    let st = stored(&mut con, &tb.keys("clock")).await;
    let ts = st.ts.unwrap();
    assert!(before <= ts && ts <= after.as_secs() as i64, "{ts}");
    // Two tokens by second ts + 2 at the latest, counted from the exact time of the call.
    let r = d.retry_after().unwrap();
    let latest =
        Duration::from_secs(ts as u64 + 2).saturating_sub(Duration::from_secs(before as u64));
    assert!(r > Duration::ZERO && r <= latest, "{r:?}");
    assert!(d.retry_after_secs().unwrap() <= 2);
    assert!(tb.try_check("clock").await.is_ok());
}

/// The status of a check comes from go-zero's script's own reply (tokens left, stored
/// timestamp), in its whole-second arithmetic: q = burst, w = ceil(burst / rate) s, r = the
/// tokens left, t = until the second at which `rate` a second have filled the bucket.
#[tokio::test]
async fn the_status_of_a_check_is_the_scripts_tokens_and_timestamp() {
    let Some(s) = RedisServer::start("the_status_of_a_check_is_the_scripts_tokens_and_timestamp")
    else {
        return;
    };
    let con = manager(&s).await;
    let tb = TokenBucket::new(con.clone(), 2, 5).unwrap();
    let st = |remaining, reset_secs| {
        Some(QuotaStatus {
            quota: 5,
            window: Duration::from_secs(3),
            remaining,
            reset: Duration::from_secs(reset_secs),
        })
    };
    let granted = |remaining, reset_secs| StatusVerdict {
        result: Ok(()),
        status: st(remaining, reset_secs),
    };
    const T: u64 = 1_000_000;
    // 1 left; 4 missing arrive 2 a second: full at T + 2.
    let answer = tb.try_check_n_status_at("st", T, 4).await.unwrap();
    assert_eq!(answer, granted(1, 2));
    // A denial takes nothing and says the same.
    let answer = tb.try_check_n_status_at("st", T, 2).await.unwrap();
    assert!(answer.result.is_err());
    assert_eq!(answer.status, st(1, 2));
    // A second later: 3, one taken; 3 missing need 2 more seconds.
    let answer = tb.try_check_n_status_at("st", T + 1, 1).await.unwrap();
    assert_eq!(answer, granted(2, 2));
    // 2 more seconds: full, and a peek says so.
    let answer = tb.try_check_n_status_at("st", T + 3, 0).await.unwrap();
    assert_eq!(answer, granted(5, 0));
    // The window is whole seconds, rounded up: 7 at 3 a second fill in 3 s.
    let odd = TokenBucket::new(con, 3, 7).unwrap();
    let answer = odd.try_check_n_status_at("odd", T, 7).await.unwrap();
    assert_eq!(
        answer.status,
        Some(QuotaStatus {
            quota: 7,
            window: Duration::from_secs(3),
            remaining: 0,
            reset: Duration::from_secs(3),
        })
    );
    // On the system clock (the trait's form): the one missing token arrives at the next
    // whole second, counted from the exact time of the call, which lies between `before` and
    // `after`. A call that straddles a second boundary says less: it is made again (on a
    // fresh key) until one does not.
    let unix = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
    };
    for attempt in 0.. {
        assert!(attempt < 5, "every call straddled a second boundary");
        let key = format!("now{attempt}");
        let before = unix();
        let StatusVerdict { result, status } = RedisLimiter::try_check_n_status(&tb, &key, 1)
            .await
            .unwrap();
        let after = unix();
        if before.as_secs() != after.as_secs() {
            continue;
        }
        assert_eq!(result, Ok(()));
        let status = status.unwrap();
        assert_eq!((status.quota, status.remaining), (5, 4));
        let next = Duration::from_secs(before.as_secs() + 1);
        assert!(
            status.reset >= next - after && status.reset <= next - before,
            "{status:?} between {before:?} and {after:?}"
        );
        assert_eq!(status.reset_secs(), 1, "{status:?}");
        break;
    }
}

/// 4 clients (connections of their own, 2 tasks each) hammer one key on the real clock from
/// just after a second boundary to just before the next-but-one: one whole-second refill
/// happens, so exactly burst + rate permits are granted, never more (the script is atomic).
#[tokio::test]
async fn four_clients_share_one_limit() {
    let Some(s) = RedisServer::start("four_clients_share_one_limit") else {
        return;
    };
    let unix = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
    };
    let (rate, burst) = (100u32, 150u32);
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(TokenBucket::new(manager(&s).await, rate, burst).unwrap());
    }
    // Start 20 ms into a second, stop 900 ms into the next one.
    let now = unix();
    let start = Duration::from_secs(now.as_secs() + 1) + Duration::from_millis(20);
    tokio::time::sleep(start.saturating_sub(now)).await;
    let stop = Duration::from_secs(start.as_secs() + 1) + Duration::from_millis(900);
    let mut tasks = tokio::task::JoinSet::new();
    for tb in &clients {
        for _ in 0..2 {
            let tb = tb.clone();
            tasks.spawn(async move {
                let (mut granted, mut calls, mut seconds) = (0u32, 0u32, Vec::new());
                // (whole second before the call, whole second after it)
                while unix() < stop {
                    let before = unix().as_secs();
                    let ok = verdict(tb.try_check("shared").await).is_ok();
                    seconds.push((before, unix().as_secs()));
                    granted += u32::from(ok);
                    calls += 1;
                    if !ok {
                        tokio::task::yield_now().await;
                    }
                }
                (granted, calls, seconds)
            });
        }
    }
    let (mut granted, mut calls, mut last) = (0, 0, 0);
    while let Some(r) = tasks.join_next().await {
        let (g, c, seconds) = r.unwrap();
        granted += g;
        calls += c;
        assert!(seconds.iter().all(|&(a, _)| a >= start.as_secs()));
        last = seconds.iter().map(|&(_, b)| b).fold(last, u64::max);
    }
    assert!(calls > granted, "demand exceeded the limit: {calls} calls");
    // Never more than a full bucket plus one refill per second boundary.
    let boundaries = (last - start.as_secs()) as u32;
    assert!(
        granted <= burst + rate * boundaries,
        "{granted} in {calls} calls"
    );
    if boundaries == 1 {
        // Demand exceeded the rate throughout: the limit was reached exactly.
        assert_eq!(granted, burst + rate, "{calls} calls");
    } else {
        eprintln!("four_clients_share_one_limit: a call stalled past the second boundary");
    }
}

#[tokio::test]
async fn local_is_an_in_process_bucket_with_a_share() {
    let Some(s) = RedisServer::start("local_is_an_in_process_bucket_with_a_share") else {
        return;
    };
    let tb = TokenBucket::new(manager(&s).await, 100, 10).unwrap();
    let l = tb.local(1.0);
    assert_eq!((l.limit().as_f64(), l.burst()), (100.0, 10));
    let l = tb.local(0.25);
    assert_eq!((l.limit().as_f64(), l.burst()), (25.0, 3));
    let l = tb.local(0.001);
    assert_eq!(l.burst(), 1);
    assert!((l.limit().as_f64() - 0.1).abs() < 1e-12);
    for bad in [0.0, -1.0, 2.0, f64::NAN] {
        let l = tb.local(bad);
        assert_eq!((l.limit().as_f64(), l.burst()), (100.0, 10), "{bad}");
    }
    // Starts full, as go-zero's rescue limiter.
    let l = tb.local(0.5);
    assert!(l.check_n(5).is_ok());
    assert!(l.check_n(5).is_err());
}

/// A fresh key's full bucket taken in one call, then a denial.
async fn drain<C: ConnectionLike + Clone + Send + Sync + 'static>(tb: &TokenBucket<C>, key: &str) {
    assert!(
        verdict(tb.try_check_n_at(key, 1000, tb.burst()).await).is_ok(),
        "{key}"
    );
    assert!(
        verdict(tb.try_check_n_at(key, 1000, 1).await).is_err(),
        "{key}"
    );
}

#[tokio::test]
async fn cluster_many_keys_over_every_master() {
    let Some(c) = RedisCluster::start("cluster_many_keys_over_every_master", 3) else {
        return;
    };
    let con = redis::cluster::ClusterClient::new(c.urls())
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    let tb = TokenBucket::builder(2, 3)
        .prefix("fleet:")
        .build(con)
        .unwrap();
    for i in 0..150 {
        drain(&tb, &format!("user{i}")).await;
    }
    for i in 0..150 {
        let key = format!("user{i}");
        // Two seconds later: 4 tokens, capped at 3.
        assert!(verdict(tb.try_check_n_at(&key, 1002, 3).await).is_ok());
    }
    // Both keys of each of the 150 users, spread over all three masters.
    let mut total = 0;
    for node in &c.nodes {
        let n: usize = node.cli(&["dbsize"]).parse().unwrap();
        assert!(n >= 40, "a master holds only {n} keys");
        total += n;
    }
    assert_eq!(total, 300);
    tb.ping().await.unwrap();
}

#[tokio::test]
async fn cluster_key_follows_its_slot_to_another_master() {
    let Some(c) = RedisCluster::start("cluster_key_follows_its_slot_to_another_master", 3) else {
        return;
    };
    let mut con = redis::cluster::ClusterClient::new(c.urls())
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    let tb = TokenBucket::new(con.clone(), 1, 5).unwrap();
    let k = tb.keys("mig");
    assert!(verdict(tb.try_check_n_at("mig", 1000, 3).await).is_ok());

    let slot = c.nodes[0].cli(&["cluster", "keyslot", &k[0]]);
    assert_eq!(slot, c.nodes[0].cli(&["cluster", "keyslot", &k[1]]));
    let src = c
        .nodes
        .iter()
        .position(|n| n.cli(&["exists", &k[0]]) == "1")
        .expect("the slot's master holds the key");
    let dst = (src + 1) % c.nodes.len();
    let id = |i: usize| c.nodes[i].cli(&["cluster", "myid"]);
    let (src_id, dst_id) = (id(src), id(dst));
    let dst_port = c.nodes[dst].port.to_string();
    let ok = |out: String, what: &str| assert_eq!(out, "OK", "{what}");
    ok(
        c.nodes[dst].cli(&["cluster", "setslot", &slot, "importing", &src_id]),
        "IMPORTING",
    );
    ok(
        c.nodes[src].cli(&["cluster", "setslot", &slot, "migrating", &dst_id]),
        "MIGRATING",
    );
    ok(
        c.nodes[src].cli(&[
            "migrate",
            "127.0.0.1",
            &dst_port,
            "",
            "0",
            "5000",
            "keys",
            &k[0],
            &k[1],
        ]),
        "MIGRATE",
    );
    for i in [dst, src, (dst + 1) % 3] {
        ok(
            c.nodes[i].cli(&["cluster", "setslot", &slot, "node", &dst_id]),
            "SETSLOT NODE",
        );
    }
    assert_eq!(c.nodes[dst].cli(&["get", &k[0]]), "2", "the state moved");
    assert!(c.nodes[src].cli(&["get", &k[0]]).contains("MOVED"));

    // The old master answers MOVED; the client follows it and the bucket carries on.
    assert!(verdict(tb.try_check_n_at("mig", 1000, 2).await).is_ok());
    assert!(verdict(tb.try_check_n_at("mig", 1000, 1).await).is_err());
    assert_eq!(
        stored(&mut con, &k).await,
        full(0, 1000, 10),
        "read through the cluster client"
    );
    assert_eq!(c.nodes[dst].cli(&["get", &k[1]]), "1000");
    // And after a SCRIPT FLUSH on the new master, the script is loaded there again.
    c.nodes[dst].cli(&["script", "flush"]);
    assert!(verdict(tb.try_check_n_at("mig", 1001, 1).await).is_ok());
}
