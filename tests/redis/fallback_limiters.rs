//! `Fallback` over the real Redis limiters other than the token bucket (whose own test file
//! has its case): `redis::Gcra`, `redis::MultiGcra` and `redis::FixedWindow` answer from
//! Redis, from their in-process twin at the fleet share while the server is down, and from
//! Redis again once it is back.
#![cfg(feature = "redis")]

use crate::common;

use std::time::Duration;

use common::redis_server::RedisServer;
use turnstile::multi_token_bucket::Bandwidth;
use turnstile::redis::{
    self, Fallback, FixedWindow, Gcra, Mode, MultiGcra, RedisLimiter, StatusVerdict,
};
use turnstile::{Clock, Limit, QuotaStatus};

/// Kill, answer in process, restart, back on Redis: the same steps for any limiter whose
/// fallback share admits exactly `local_burst` checks of one key at once.
async fn through_an_outage<L: RedisLimiter + 'static>(
    s: &mut RedisServer,
    limiter: L,
    key_in_redis: &str,
    local_burst: u32,
) {
    let f = Fallback::builder(limiter)
        .timeout(Duration::from_millis(300))
        .fleet_size(2)
        .build()
        .unwrap();
    assert!(f.check("k").await.unwrap().is_ok(), "answered by Redis");
    assert_eq!(s.cli(&["exists", key_in_redis]), "1");
    assert_eq!(f.mode(), Mode::Redis);

    s.kill();
    for i in 0..local_burst {
        assert!(f.check("k").await.unwrap().is_ok(), "local grant {i}");
    }
    assert_eq!(f.mode(), Mode::Fallback);
    assert!(
        f.check("k").await.unwrap().is_err(),
        "the share's burst is spent"
    );

    s.restart();
    common::back_on_redis(&f).await;
    assert!(f.check("k").await.unwrap().is_ok(), "a fresh server grants");
    assert_eq!(
        s.cli(&["exists", key_in_redis]),
        "1",
        "counted in Redis again"
    );
}

#[tokio::test]
async fn gcra_through_an_outage() {
    let Some(mut s) = RedisServer::start("gcra_through_an_outage") else {
        return;
    };
    let con = redis::connect(&s.url()).await.unwrap();
    // One a minute, bursts of 6: the fleet share of 2 admits 3 at once.
    let g = Gcra::builder(Limit::every(Duration::from_secs(60)), 6)
        .prefix("g:")
        .build(con)
        .unwrap();
    tokio::time::timeout(
        Duration::from_secs(20),
        through_an_outage(&mut s, g, "g:k", 3),
    )
    .await
    .expect("no hang");
}

#[tokio::test]
async fn multi_gcra_through_an_outage() {
    let Some(mut s) = RedisServer::start("multi_gcra_through_an_outage") else {
        return;
    };
    let con = redis::connect(&s.url()).await.unwrap();
    // 6 a minute and 100 a day: the fleet share of 2 admits 3 at once (the per-minute
    // limit's half), from a local MultiTokenBucket.
    let m = MultiGcra::builder(&[
        Bandwidth::per(6, Duration::from_secs(60)),
        Bandwidth::per(100, Duration::from_secs(86_400)),
    ])
    .prefix("m:")
    .build(con)
    .unwrap();
    tokio::time::timeout(
        Duration::from_secs(20),
        through_an_outage(&mut s, m, "m:k", 3),
    )
    .await
    .expect("no hang");
}

/// `try_check_n_status` through a `Fallback<MultiGcra>`: the binding limit's status from
/// Redis, then from the key's local `MultiTokenBucket` (its binding limit too).
#[tokio::test]
async fn multi_gcra_status_from_redis_then_from_the_local_limiter() {
    let Some(mut s) =
        RedisServer::start("multi_gcra_status_from_redis_then_from_the_local_limiter")
    else {
        return;
    };
    tokio::time::timeout(Duration::from_secs(20), async {
        let con = redis::connect(&s.url()).await.unwrap();
        let m = MultiGcra::builder(&[
            Bandwidth::per(60, Duration::from_secs(60)),
            Bandwidth::per(4, Duration::from_secs(3600)),
        ])
        .build(con)
        .unwrap();
        let f = Fallback::builder(m)
            .timeout(Duration::from_millis(300))
            .fleet_size(2)
            .build()
            .unwrap();
        // Redis: the hourly limit binds, from a full bucket (reset exactly one T, 15 min).
        assert_eq!(
            RedisLimiter::try_check_n_status(&f, "k", 1).await.unwrap(),
            StatusVerdict {
                result: Ok(()),
                status: Some(QuotaStatus {
                    quota: 4,
                    window: Duration::from_secs(3600),
                    remaining: 3,
                    reset: Duration::from_secs(900),
                }),
            }
        );
        s.kill();
        // Local: the hourly limit's share, 2 per hour (30 min a permit), binds.
        for left in [1, 0] {
            let v = RedisLimiter::try_check_n_status(&f, "k", 1).await.unwrap();
            assert_eq!(v.result, Ok(()));
            assert_eq!(f.mode(), Mode::Fallback);
            let st = v.status.unwrap();
            assert_eq!(
                (st.quota, st.remaining, st.window_secs()),
                (2, left, 3600),
                "{st:?}"
            );
        }
        let v = RedisLimiter::try_check_n_status(&f, "k", 1).await.unwrap();
        assert!(v.result.is_err());
        s.restart();
        common::back_on_redis(&f).await;
        assert!(f.check("k").await.unwrap().is_ok(), "a fresh server grants");
    })
    .await
    .expect("no hang");
}

#[tokio::test]
async fn fixed_window_through_an_outage() {
    let Some(mut s) = RedisServer::start("fixed_window_through_an_outage") else {
        return;
    };
    let con = redis::connect(&s.url()).await.unwrap();
    // 10 a minute: the fleet share of 2 admits 5.
    let w = FixedWindow::builder(10, Duration::from_secs(60))
        .prefix("w:")
        .build(con)
        .unwrap();
    tokio::time::timeout(
        Duration::from_secs(20),
        through_an_outage(&mut s, w, "w:k", 5),
    )
    .await
    .expect("no hang");
}

/// `try_check_n_status` through a `Fallback`: the GCRA's own status while Redis answers; the
/// key's local limiter's while it is down, read with the check (the numbers the in-process
/// `per_key` policy shows: that limiter's `quota_at`); the GCRA's again once Redis is back.
#[tokio::test]
async fn the_status_comes_from_redis_then_from_the_local_limiter() {
    let Some(mut s) = RedisServer::start("the_status_comes_from_redis_then_from_the_local_limiter")
    else {
        return;
    };
    tokio::time::timeout(Duration::from_secs(20), async {
        let con = redis::connect(&s.url()).await.unwrap();
        // One a minute, bursts of 6; the fleet share of 2: one per 2 minutes, bursts of 3.
        let g = Gcra::builder(Limit::every(Duration::from_secs(60)), 6)
            .prefix("g:")
            .build(con)
            .unwrap();
        let f = Fallback::builder(g)
            .timeout(Duration::from_millis(300))
            .fleet_size(2)
            .build()
            .unwrap();
        // Redis mode: the GCRA's answer, from a full bucket (reset exactly one T).
        let gcra = |remaining, secs| StatusVerdict {
            result: Ok(()),
            status: Some(QuotaStatus {
                quota: 6,
                window: Duration::from_secs(360),
                remaining,
                reset: Duration::from_secs(secs),
            }),
        };
        assert_eq!(
            RedisLimiter::try_check_n_status(&f, "k", 1).await.unwrap(),
            gcra(5, 60)
        );

        s.kill();
        let key = "k".to_string();
        for (left, minutes) in [(2, 2), (1, 4), (0, 6)] {
            let StatusVerdict { result, status } =
                RedisLimiter::try_check_n_status(&f, "k", 1).await.unwrap();
            assert_eq!(result, Ok(()), "local grant, {left} left");
            assert_eq!(f.mode(), Mode::Fallback);
            let st = status.expect("the local limiter's status");
            assert_eq!((st.quota, st.remaining), (3, left), "{st:?}");
            assert_eq!(
                (st.window_secs(), st.reset_secs()),
                (360, 60 * minutes),
                "{st:?}"
            );
            // The local limiter's own reading, a moment later: the same but for that moment.
            let later = f.local().quota_at(&key, f.local().clock().now()).unwrap();
            assert_eq!(
                (later.quota, later.window, later.remaining),
                (st.quota, st.window, st.remaining)
            );
            assert!(
                later.reset <= st.reset && st.reset - later.reset < Duration::from_secs(1),
                "{st:?} then {later:?}"
            );
        }
        // The local refusal: nothing left, full in 6 minutes (the window of the share).
        let StatusVerdict { result, status } =
            RedisLimiter::try_check_n_status(&f, "k", 1).await.unwrap();
        assert!(result.is_err());
        let st = status.unwrap();
        assert_eq!(
            (st.quota, st.remaining, st.reset_secs()),
            (3, 0, 360),
            "{st:?}"
        );

        s.restart();
        common::back_on_redis(&f).await;
        // A fresh server: the GCRA's full bucket less one.
        assert_eq!(
            RedisLimiter::try_check_n_status(&f, "k", 1).await.unwrap(),
            gcra(5, 60)
        );
    })
    .await
    .expect("no hang");
}
