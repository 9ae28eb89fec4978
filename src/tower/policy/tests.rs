use super::*;
use crate::tower::key;
use crate::{Clock, Keyed, KeyedTokenBucket, Nanos};
use crate::{Limit, ManualClock, TokenBucket};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Waker;
use std::task::{Context, Poll};
use std::time::Duration;

fn now_or_never<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("an in-process policy decides at once"),
    }
}

/// A `PerKey` over `map` (1/s, burst 2, on a clock at 1 s): the status only on the
/// answers asked for, exact; reserve-ahead as the map can; a refund gives the permit back.
/// Returns the waits of two requests past the burst under a 10 s `max_wait`.
fn per_key_contract<M: PerKeyMap<u8>>(map: M) -> Vec<Duration> {
    let p = Arc::new(per_key(
        "k",
        key::from_fn(|r: &Request<()>| r.uri().path().as_bytes().get(1).copied()),
        map,
    ));
    let req = |path: &str| Request::get(path).body(()).unwrap();
    let decide = |path: &str, ask: Ask| {
        now_or_never(Policy::<()>::decide(
            &p,
            Policy::<()>::key(&*p, &req(path)),
            ask,
        ))
    };
    let refusals_only = Ask {
        report: true,
        ..Ask::default()
    };
    let always = Ask {
        report_grants: true,
        ..refusals_only
    };
    let status = |remaining, reset: u64| QuotaStatus {
        quota: 2,
        window: Duration::from_secs(2),
        remaining,
        reset: Duration::from_secs(reset),
    };
    // Grants under the default headers carry no status; under Always they do.
    let d = decide("/a", refusals_only);
    assert!(d.result.is_ok() && d.report.items.is_empty());
    let d = decide("/a", always);
    assert!(d.result.is_ok());
    assert_eq!(
        d.report.items,
        vec![ReportItem::new("k".into(), status(0, 2))]
    );
    // A refusal: with the status when asked for, without when not.
    let d = decide("/a", refusals_only);
    assert!(d.result.is_err());
    assert_eq!(
        d.report.items,
        vec![ReportItem::new("k".into(), status(0, 2))]
    );
    assert!(decide("/a", Ask::default()).report.items.is_empty());
    // Another key is whole.
    let d = decide("/b", always);
    assert_eq!(
        d.report.items,
        vec![ReportItem::new("k".into(), status(1, 1))]
    );
    // A refund gives "/b"'s permit back; "/a" has none to spend.
    match decide("/b", Ask::default()).result {
        Ok(g) => Policy::<()>::refund(&*p, g),
        Err(_) => panic!("\"/b\" had one left"),
    }
    let d = decide("/b", always);
    assert!(d.result.is_ok(), "the refund gave nothing back");
    assert_eq!(
        d.report.items,
        vec![ReportItem::new("k".into(), status(0, 2))]
    );
    // Past the burst with a maximum wait: reserved ahead, or refused at once.
    let ahead = Ask {
        max_wait: Duration::from_secs(10),
        ..Ask::default()
    };
    (0..2)
        .map(|_| {
            let d = decide("/a", ahead);
            if d.result.is_err() {
                assert_eq!(d.wait, Duration::ZERO);
            }
            d.wait
        })
        .collect()
}

#[test]
fn per_key_over_either_map_reports_only_what_is_asked_and_refunds() {
    let limit = Limit::per_second(1.0).unwrap();
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let c = clock.clone();
    let keyed =
        Keyed::builder(move |_: &u8| TokenBucket::builder(limit, 2).clock(c.clone()).build())
            .clock(clock.clone())
            .build()
            .unwrap();
    // A Keyed of token buckets reserves: 1 s, then 2 s ahead.
    assert_eq!(
        per_key_contract(keyed),
        [Duration::from_secs(1), Duration::from_secs(2)]
    );
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let inline = KeyedTokenBucket::builder(limit, 2)
        .clock(clock.clone())
        .build()
        .unwrap();
    // The inline map cannot: refused at once, twice (the first reserved nothing).
    assert_eq!(per_key_contract(inline), [Duration::ZERO; 2]);
}

#[test]
fn both_reservations_hold_until_the_later_ones_time() {
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let bucket = |per_sec| {
        TokenBucket::builder(Limit::per_second(per_sec).unwrap(), 1)
            .clock(clock.clone())
            .build()
    };
    let both = Arc::new(global("slow", bucket(1.0)).and(global("fast", bucket(2.0))));
    let req = Request::new(());
    let ask = Ask {
        max_wait: Duration::from_secs(10),
        ..Ask::default()
    };
    let decide = || {
        now_or_never(Policy::<()>::decide(
            &both,
            Policy::<()>::key(&*both, &req),
            ask,
        ))
    };
    assert_eq!(decide().wait, Duration::ZERO);
    // The slow bucket's next token is 1 s away, the fast one's 0.5 s: wait for both.
    let d = decide();
    assert!(d.result.is_ok());
    assert_eq!(d.wait, Duration::from_secs(1));
}

/// A policy whose decision never comes (a Redis that stalls, with no deadline).
struct Stalled;

impl Policy<()> for Stalled {
    type Key = ();
    type Grant = ();
    type Future = std::future::Pending<Decision<()>>;
    fn key(&self, _: &Request<()>) {}
    fn decide(self: &Arc<Self>, _: (), _: Ask) -> Self::Future {
        std::future::pending()
    }
    fn refund(&self, _: ()) {}
}

/// Polls `policy`'s decision once, for a request, and drops it while it is pending.
fn abandon<P: Policy<()>>(policy: &Arc<P>) {
    let req = Request::new(());
    let mut fut = Policy::<()>::decide(policy, policy.key(&req), Ask::default());
    let noop = &mut Context::from_waker(Waker::noop());
    assert!(Pin::new(&mut fut).poll(noop).is_pending());
}

#[test]
fn and_gives_the_first_grant_back_when_dropped_while_the_second_decides() {
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    // Burst 1, no refill on a clock that stands still: a permit is back only if refunded.
    let bucket = || {
        TokenBucket::builder(Limit::per_second(1.0).unwrap(), 1)
            .clock(clock.clone())
            .build()
    };
    let tokens = |g: &Global<TokenBucket<ManualClock>>| g.limiter().tokens();

    let both = Arc::new(global("a", bucket()).and(Stalled));
    abandon(&both);
    assert_eq!(
        tokens(&both.first),
        1.0,
        "the first's grant was not given back"
    );

    // Nested, either way round: every grant taken before the stall comes back.
    let left = Arc::new(
        global("a", bucket())
            .and(global("b", bucket()))
            .and(Stalled),
    );
    abandon(&left);
    assert_eq!(
        (tokens(&left.first.first), tokens(&left.first.second)),
        (1.0, 1.0)
    );
    let right = Arc::new(global("a", bucket()).and(global("b", bucket()).and(Stalled)));
    abandon(&right);
    assert_eq!(
        (tokens(&right.first), tokens(&right.second.first)),
        (1.0, 1.0)
    );

    // Delay mode: the first reserved ahead (its burst spent, the next token 1 s away);
    // the reservation comes back too.
    let ahead = Arc::new(global("a", bucket()).and(Stalled));
    assert!(ahead.first.limiter().check_n_at(clock.now(), 1).is_ok());
    let mut fut = Policy::<()>::decide(
        &ahead,
        ((), ()),
        Ask {
            max_wait: Duration::from_secs(10),
            ..Ask::default()
        },
    );
    let noop = &mut Context::from_waker(Waker::noop());
    assert!(Pin::new(&mut fut).poll(noop).is_pending());
    assert_eq!(tokens(&ahead.first), -1.0, "the first reserved ahead");
    drop(fut);
    assert_eq!(
        tokens(&ahead.first),
        0.0,
        "the reservation was not given back"
    );

    // A decision that completed is the caller's: dropping it after changes nothing.
    let done = Arc::new(global("a", bucket()).and(global("b", bucket())));
    let d = now_or_never(Policy::<()>::decide(&done, ((), ()), Ask::default()));
    assert!(d.result.is_ok());
    drop(d);
    assert_eq!((tokens(&done.first), tokens(&done.second)), (0.0, 0.0));
}

#[cfg(feature = "redis")]
mod fleet {
    use super::*;
    use crate::redis::{RedisLimitError, RedisLimiter};
    use crate::FixedWindow;
    use std::sync::atomic::{AtomicU8, Ordering};

    const GRANT: u8 = 0;
    const FAIL: u8 = 1;
    const STALL: u8 = 2;

    /// A Redis limiter that grants, fails or stalls, as told; its local form is a window
    /// of 4 a minute, scaled by the share.
    #[derive(Default)]
    struct Fake(AtomicU8);

    impl RedisLimiter for Fake {
        type Local = FixedWindow;
        fn local(&self, share: f64) -> FixedWindow {
            FixedWindow::new((4.0 * share).ceil() as u32, Duration::from_secs(60)).unwrap()
        }
        /// Up while it grants, down otherwise: a `Fallback` over it stays in fallback mode
        /// until it grants again.
        async fn ping(&self) -> Result<(), RedisLimitError> {
            match self.0.load(Ordering::Relaxed) {
                GRANT => Ok(()),
                _ => Err(RedisLimitError::Timeout(Duration::ZERO)),
            }
        }
        async fn try_check_n(
            &self,
            _: &str,
            _: u32,
        ) -> Result<Result<(), Denied>, RedisLimitError> {
            match self.0.load(Ordering::Relaxed) {
                GRANT => Ok(Ok(())),
                FAIL => Err(RedisLimitError::UnexpectedReply("OOM".into())),
                _ => std::future::pending().await,
            }
        }
    }

    impl crate::redis::RedisBatch for Fake {
        fn validate(&self, _: &str, _: u32) -> Result<(), RedisLimitError> {
            Ok(())
        }
        async fn try_check_batch(
            &self,
            key: &str,
            ns: &[u32],
        ) -> Result<Vec<Result<(), Denied>>, RedisLimitError> {
            let mut out = Vec::new();
            for &n in ns {
                out.push(self.try_check_n(key, n).await?);
            }
            Ok(out)
        }
    }

    type Fleet = super::Fleet<key::Header, Fake>;

    fn policy(failure: FailurePolicy, mode: u8) -> Arc<Fleet> {
        let f = Fleet::builder(
            "f",
            key::Header("x-key".parse().unwrap()),
            Fake(AtomicU8::new(mode)),
        );
        Arc::new(f.on_failure(failure).build().unwrap())
    }

    async fn decide(p: &Arc<Fleet>, key: Option<&str>, ask: Ask) -> Decision<()> {
        let mut req = Request::new(());
        if let Some(k) = key {
            req.headers_mut().insert("x-key", k.parse().unwrap());
        }
        Policy::<()>::decide(p, p.key(&req), ask).await
    }

    /// The answers to `n` checks of one key: `Some(Retry-After in seconds)` for a refusal,
    /// `None` for a grant.
    async fn answers(p: &Arc<Fleet>, n: usize) -> Vec<Option<Option<u64>>> {
        let mut out = Vec::new();
        for _ in 0..n {
            let d = decide(p, Some("k"), Ask::default()).await;
            out.push(d.result.err().map(|e| e.retry_after_secs()));
        }
        out
    }

    #[tokio::test]
    async fn each_failure_policy_answers_a_failing_redis_as_it_says() {
        assert_eq!(
            answers(&policy(FailurePolicy::Open, FAIL), 6).await,
            [None; 6]
        );
        // Closed: refused, and told when to come back.
        assert_eq!(
            answers(&policy(FailurePolicy::Closed, FAIL), 2).await,
            [Some(Some(1)); 2]
        );
        // Local with half the limit: 2 of the window's 4, then refused until the window
        // ends (60 s away, rounded up).
        let local = policy(FailurePolicy::Local(0.5), FAIL);
        let got = answers(&local, 4).await;
        assert_eq!(got[..2], [None, None]);
        assert!(matches!(got[2], Some(Some(59..=60))), "{got:?}");
        assert_eq!(local.local().unwrap().len(), 1);
        // The local answer reports the local window, when asked for.
        let d = decide(
            &local,
            Some("k"),
            Ask {
                report: true,
                ..Ask::default()
            },
        )
        .await;
        assert_eq!(d.report.items[0].status.quota, 2);
        assert_eq!(local.failures(), 5);
        // The default is the local answer with the whole limit.
        let default = Arc::new(fleet(
            "f",
            key::Header("x-key".parse().unwrap()),
            Fake(AtomicU8::new(FAIL)),
        ));
        assert_eq!(default.failure_policy(), FailurePolicy::Local(1.0));
        assert_eq!(
            answers(&default, 5)
                .await
                .iter()
                .filter(|a| a.is_none())
                .count(),
            4
        );
        // A Redis that answers is what decides, whatever the failure policy.
        assert_eq!(
            answers(&policy(FailurePolicy::Closed, GRANT), 3).await,
            [None; 3]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_redis_is_answered_at_the_deadline_by_the_failure_policy() {
        let deadline = Duration::from_millis(30);
        for (failure, granted) in [(FailurePolicy::Open, true), (FailurePolicy::Closed, false)] {
            let p = Fleet::builder(
                "f",
                key::Header("x-key".parse().unwrap()),
                Fake(AtomicU8::new(STALL)),
            );
            let p = Arc::new(p.on_failure(failure).deadline(deadline).build().unwrap());
            let start = tokio::time::Instant::now();
            // Far past the deadline, the test's own: without one, no answer ever comes.
            let d = tokio::time::timeout(deadline * 100, decide(&p, Some("k"), Ask::default()))
                .await
                .expect("no answer at the deadline");
            assert_eq!(start.elapsed(), deadline);
            assert_eq!(d.result.is_ok(), granted);
            assert_eq!(p.failures(), 1);
        }
    }

    #[tokio::test]
    async fn a_request_without_a_key_gets_the_missing_key_choice() {
        let with = |m: MissingKey<String>| {
            let f = Fleet::builder(
                "f",
                key::Header("x-key".parse().unwrap()),
                Fake(AtomicU8::new(FAIL)),
            );
            Arc::new(
                f.on_failure(FailurePolicy::Local(0.5))
                    .on_missing_key(m)
                    .build()
                    .unwrap(),
            )
        };
        // Allow: through, untouched (no failure: Redis is not asked).
        let p = with(MissingKey::Allow);
        for key in [None, Some("")] {
            assert!(decide(&p, key, Ask::default()).await.result.is_ok());
        }
        assert_eq!(p.failures(), 0);
        // Deny: refused, with no Retry-After (no wait makes it acceptable).
        let p = with(MissingKey::Deny);
        for key in [None, Some("")] {
            let d = decide(&p, key, Ask::default()).await;
            assert_eq!(d.result.unwrap_err().retry_after(), None);
        }
        // As: every keyless request shares one key's limit (2 here, locally).
        let p = with(MissingKey::As("anonymous".into()));
        let mut granted = 0;
        for key in [None, Some(""), None, None] {
            granted += decide(&p, key, Ask::default()).await.result.is_ok() as u32;
        }
        assert_eq!(granted, 2);
        assert!(p.local().unwrap().contains("anonymous"));
        assert!(decide(&p, Some("other"), Ask::default())
            .await
            .result
            .is_ok());
    }

    #[test]
    fn bad_settings_are_typed_errors() {
        let f = || super::Fleet::builder("f", key::PeerIp, Fake::default());
        assert!(matches!(
            f().deadline(Duration::ZERO).build(),
            Err(crate::ConfigError::ZeroTimeout)
        ));
        for share in [0.0, 1.5, f64::NAN] {
            assert!(matches!(
                f().on_failure(FailurePolicy::Local(share)).build(),
                Err(crate::ConfigError::InvalidShare(_))
            ));
        }
        assert!(matches!(
            f().local_max_keys(0).build(),
            Err(crate::ConfigError::ZeroMaxKeys)
        ));
        // Under another policy too: the bound is checked whatever answers failures.
        assert!(matches!(
            f().local_max_keys(0)
                .on_failure(FailurePolicy::Open)
                .build(),
            Err(crate::ConfigError::ZeroMaxKeys)
        ));
        let local = f().local_max_keys(3).build().unwrap();
        assert_eq!(local.local().unwrap().max_keys(), 3);
        // Options apply in any order: the bound set before the policy holds.
        let local = f()
            .local_max_keys(3)
            .on_failure(FailurePolicy::Local(0.5))
            .build()
            .unwrap();
        assert_eq!(local.local().unwrap().max_keys(), 3);
        let closed = f().on_failure(FailurePolicy::Closed).build().unwrap();
        assert!(closed.local().is_none());
    }

    /// One decision of key "k" by `p`.
    #[cfg(feature = "metrics")]
    async fn decide_any<P: Policy<()>>(p: &Arc<P>) -> Decision<P::Grant> {
        let mut req = Request::new(());
        req.headers_mut().insert("x-key", "k".parse().unwrap());
        Policy::<()>::decide(p, p.key(&req), Ask::default()).await
    }

    #[cfg(feature = "metrics")]
    #[test]
    fn a_fleet_policy_publishes_its_redis_calls_errors_fallback_and_batches() {
        use crate::redis::{Coalesce, Fallback, RedisLimiter};
        use metrics_exporter_prometheus::PrometheusBuilder;
        let prometheus = PrometheusBuilder::new().build_recorder();
        let handle = prometheus.handle();
        // Names no other test uses: `publish` reads every policy of the process.
        let (bare, fb, co) = (
            "fleet_metrics_bare",
            "fleet_metrics_fallback",
            "fleet_metrics_co",
        );
        let header = || key::Header("x-key".parse().unwrap());
        let bare_p = Arc::new(super::fleet(bare, header(), Fake(AtomicU8::new(GRANT))));
        let fb_p = Arc::new(super::fleet(
            fb,
            header(),
            Fallback::new(Fake(AtomicU8::new(STALL))),
        ));
        let co_p = Arc::new(super::fleet(
            co,
            header(),
            Coalesce::new(Fake(AtomicU8::new(GRANT))),
        ));
        // Paused time: a stalled call reaches its deadline at once, in order.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let text = metrics::with_local_recorder(&prometheus, || {
            rt.block_on(async {
                // Three answered calls, two failed ones, one past the deadline.
                for _ in 0..3 {
                    assert!(decide(&bare_p, Some("k"), Ask::default())
                        .await
                        .result
                        .is_ok());
                }
                bare_p.limiter.0.store(FAIL, Ordering::Relaxed);
                for _ in 0..2 {
                    decide(&bare_p, Some("k"), Ask::default()).await;
                }
                bare_p.limiter.0.store(STALL, Ordering::Relaxed);
                decide(&bare_p, Some("k"), Ask::default()).await;
                // The fallback's call stalls past its timeout: fallback mode, answered in
                // process, and it stays there (the fake's PING fails while it stalls).
                decide_any(&fb_p).await;
                assert_eq!(fb_p.limiter.mode(), crate::redis::Mode::Fallback);
                decide_any(&co_p).await;
                assert!(co_p.limiter.coalesce_stats().is_some());
            });
            crate::metrics::publish();
            handle.render()
        });
        let value = |series: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
                .map(|v| v.parse::<f64>().unwrap())
        };
        let errors = |kind: &str| {
            value(&format!(
                "turnstile_redis_errors_total{{policy=\"{bare}\",kind=\"{kind}\"}}"
            ))
        };
        assert_eq!(errors("unexpected_reply"), Some(2.0), "{text}");
        assert_eq!(errors("timeout"), Some(1.0), "{text}");
        assert_eq!(
            value(&format!(
                "turnstile_redis_call_seconds_count{{policy=\"{bare}\"}}"
            )),
            Some(6.0),
            "{text}"
        );
        // Neither a fallback nor a coalescer: no such series for the bare limiter.
        assert!(!text.contains(&format!("turnstile_fallback_mode{{policy=\"{bare}\"}}")));
        assert_eq!(
            value(&format!("turnstile_fallback_mode{{policy=\"{fb}\"}}")),
            Some(1.0),
            "{text}"
        );
        let switches = |to: &str| {
            value(&format!(
                "turnstile_fallback_switches_total{{policy=\"{fb}\",to=\"{to}\"}}"
            ))
        };
        assert_eq!(
            (switches("fallback"), switches("redis")),
            (Some(1.0), Some(0.0))
        );
        let co_series = |name: &str| value(&format!("{name}{{policy=\"{co}\"}}"));
        assert_eq!(
            co_series("turnstile_coalesce_checks_total"),
            Some(1.0),
            "{text}"
        );
        assert_eq!(
            co_series("turnstile_coalesce_calls_total"),
            Some(1.0),
            "{text}"
        );
        assert_eq!(co_series("turnstile_coalesce_queued"), Some(0.0), "{text}");
    }
}

/// The report's binding item is `Statuses::binding`'s, whatever the limits hold, ties
/// included.
#[test]
fn the_binding_item_is_the_statuses_binding_limit() {
    use crate::multi_token_bucket::{Bandwidth, MultiTokenBucket};
    let sec = Duration::from_secs(1);
    let limits = [
        Bandwidth::per(3, sec),
        Bandwidth::per(8, 4 * sec),
        Bandwidth::per(20, 60 * sec),
        Bandwidth::per(1_000, 3600 * sec),
    ];
    let mtb = MultiTokenBucket::builder(&limits)
        .clock(ManualClock::default())
        .build()
        .unwrap();
    let names: Vec<Arc<str>> = ["a", "b", "c", "d"].map(Arc::from).to_vec();
    let mut seen = [false; 4];
    for step in 0..40u64 {
        let now = Nanos::new(step * 300_000_000);
        let _ = mtb.check_n_at(now, (step % 3) as u32);
        let s = mtb.status_at(now);
        let report = multi_report(&names, &s);
        let b: Vec<_> = report.items.iter().filter(|i| i.binding).collect();
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].status, s.binding(), "step {step}");
        seen[binding(&s)] = true;
        assert_eq!(report.items.len(), 4);
    }
    assert!(seen.iter().filter(|s| **s).count() >= 2, "{seen:?}");
    // Fewer names than limits: the limits past them are left out.
    let s = mtb.status_at(Nanos::ZERO);
    assert_eq!(multi_report(&names[..2], &s).items.len(), 2);
}

/// A policy that refuses, its decision in flight for two polls (a Redis round trip).
struct RefusesLater;

impl Policy<()> for RefusesLater {
    type Key = ();
    type Grant = ();
    type Future = Pin<Box<dyn Future<Output = Decision<()>> + Send>>;
    fn key(&self, _: &Request<()>) {}
    fn decide(self: &Arc<Self>, _: (), _: Ask) -> Self::Future {
        let mut polls = 0;
        Box::pin(std::future::poll_fn(move |cx| {
            polls += 1;
            if polls <= 2 {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            Poll::Ready(Decision {
                result: Err(Denied::new(Nanos::ZERO, None)),
                wait: Duration::ZERO,
                report: Report::default(),
            })
        }))
    }
    fn refund(&self, _: ()) {}
}

#[test]
fn a_decision_in_flight_is_judged_when_it_comes() {
    for (mode, passes, counts) in [
        (Mode::Shadow, true, (0, 0, 1)),
        (Mode::Enforce, false, (0, 1, 0)),
    ] {
        let p = Arc::new(RefusesLater.enforcement(Enforcement::new(mode).unwrap()));
        let mut fut = Policy::<()>::decide(&p, (), Ask::default());
        let noop = &mut Context::from_waker(Waker::noop());
        // Still deciding after `decide`'s poll and this one: nothing counted yet.
        assert!(Pin::new(&mut fut).poll(noop).is_pending());
        assert_eq!(p.counts(), Counts::default());
        let Poll::Ready(d) = Pin::new(&mut fut).poll(noop) else {
            panic!("decided on the third poll")
        };
        assert_eq!(d.result.is_ok(), passes);
        let c = p.counts();
        assert_eq!((c.allowed, c.refused, c.shadow_refused), counts);
    }
}

#[test]
fn a_client_is_its_keys_not_its_cost() {
    use std::hash::{DefaultHasher, Hasher};
    let hash = |f: &dyn Fn(&mut DefaultHasher)| {
        let mut h = DefaultHasher::new();
        f(&mut h);
        h.finish()
    };
    let ip = |b: u8| key::from_fn(move |_: &Request<()>| Some(b));
    let map = || KeyedTokenBucket::new(Limit::per_second(1.0).unwrap(), 1);
    let one = per_key("k", ip(1), map());
    let priced = per_key("k", ip(1), map()).cost(|_: &Request<()>| 3);
    // A cost changes nothing: the client is the inner policy's key.
    assert_eq!(
        hash(&|h| Policy::<()>::hash_client(&priced, &(Some(7u8), 3), h)),
        hash(&|h| Policy::<()>::hash_client(&priced, &(Some(7u8), 9), h)),
    );
    assert_eq!(
        hash(&|h| Policy::<()>::hash_client(&priced, &(Some(7u8), 3), h)),
        hash(&|h| Policy::<()>::hash_client(&one, &Some(7u8), h)),
    );
    assert_ne!(
        hash(&|h| Policy::<()>::hash_client(&one, &Some(7u8), h)),
        hash(&|h| Policy::<()>::hash_client(&one, &Some(8u8), h)),
    );
    // Both keys of an `And`; a global policy has none.
    let both = per_key("a", ip(1), map()).and(per_key("b", ip(2), map()));
    assert_ne!(
        hash(&|h| Policy::<()>::hash_client(&both, &(Some(1u8), Some(2u8)), h)),
        hash(&|h| Policy::<()>::hash_client(&both, &(Some(1u8), Some(3u8)), h)),
    );
    let all = global("all", TokenBucket::new(Limit::per_second(1.0).unwrap(), 1));
    assert_eq!(
        hash(&|h| Policy::<()>::hash_client(&all, &(), h)),
        DefaultHasher::new().finish()
    );
}

#[cfg(feature = "metrics")]
#[test]
fn policies_of_one_name_add_up_to_one_series() {
    use metrics_exporter_prometheus::PrometheusBuilder;
    let prometheus = PrometheusBuilder::new().build_recorder();
    let handle = prometheus.handle();
    // A name no other test uses: `publish` reads every policy of the process.
    let name = "policies_of_one_name_add_up";
    let bucket = |burst| TokenBucket::new(Limit::per_second(1.0).unwrap(), burst);
    let (a, b) = (
        Arc::new(global(name, bucket(2))),
        Arc::new(global(name, bucket(3))),
    );
    let dropped = Arc::new(global(name, bucket(100)));
    for _ in 0..4 {
        for p in [&a, &b, &dropped] {
            let _ = now_or_never(Policy::<()>::decide(p, (), Ask::default()));
        }
    }
    // A dropped policy's counts leave the totals; the others' stay, summed.
    drop(dropped);
    metrics::with_local_recorder(&prometheus, crate::metrics::publish);
    let text = handle.render();
    let series = |decision: &str| {
        let prefix = format!(
            "turnstile_decisions_total{{policy=\"{name}\",decision=\"{decision}\",mode=\"enforce\"}} "
        );
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map(|v| v.parse::<u64>().unwrap())
    };
    assert_eq!(series("allowed"), Some(2 + 3), "{text}");
    assert_eq!(series("refused"), Some(2 + 1), "{text}");
}

#[cfg(feature = "metrics")]
#[test]
fn a_per_key_policy_publishes_its_maps_keys_evictions_and_turned_away() {
    use crate::keyed::WhenFull;
    use metrics_exporter_prometheus::PrometheusBuilder;
    let prometheus = PrometheusBuilder::new().build_recorder();
    let handle = prometheus.handle();
    // A name no other test uses: `publish` reads every policy of the process.
    let name = "a_per_key_policy_publishes_its_map";
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let map = KeyedTokenBucket::builder(Limit::per_second(1.0).unwrap(), 1)
        .max_keys(2)
        .when_full(WhenFull::Deny)
        .clock(clock.clone())
        .sweep_every(Duration::MAX)
        .build()
        .unwrap();
    let p = Arc::new(per_key(
        name,
        key::from_fn(|r: &Request<()>| r.uri().path().as_bytes().get(1).copied()),
        map,
    ));
    for k in [1u8, 2, 3, 3] {
        let _ = now_or_never(Policy::<()>::decide(&p, Some(k), Ask::default()));
    }
    // Two keys held; key 3 turned away twice; then both refill to idle and are evicted.
    clock.advance(Duration::from_secs(2));
    assert_eq!(p.map().evict_idle_at(clock.now()), 2);
    let _ = now_or_never(Policy::<()>::decide(&p, Some(4), Ask::default()));
    metrics::with_local_recorder(&prometheus, crate::metrics::publish);
    let text = handle.render();
    let value = |series: &str| {
        let prefix = format!("{series}{{policy=\"{name}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map(|v| v.parse::<u64>().unwrap())
    };
    assert_eq!(value("turnstile_keys"), Some(1), "{text}");
    assert_eq!(value("turnstile_keys_max"), Some(2), "{text}");
    assert_eq!(value("turnstile_evictions_total"), Some(2), "{text}");
    assert_eq!(value("turnstile_map_full_total"), Some(2), "{text}");
}

#[cfg(feature = "metrics")]
#[test]
fn a_policy_records_the_waits_it_gives_only_to_requests_that_wait() {
    use metrics_exporter_prometheus::PrometheusBuilder;
    let prometheus = PrometheusBuilder::new().build_recorder();
    let handle = prometheus.handle();
    let name = "a_policy_records_the_waits";
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let bucket = TokenBucket::builder(Limit::per_second(1.0).unwrap(), 1)
        .clock(clock.clone())
        .build();
    let p = Arc::new(global(name, bucket));
    let ask = |enforced| Ask {
        max_wait: Duration::from_secs(10),
        enforced,
        ..Ask::default()
    };
    metrics::with_local_recorder(&prometheus, || {
        // No wait, then 1 s, then 2 s; then 3 s for a client not enforced, which goes on at
        // once (the reservation holds, no wait recorded).
        for (enforced, wait) in [(true, 0), (true, 1), (true, 2), (false, 3)] {
            let d = now_or_never(Policy::<()>::decide(&p, (), ask(enforced)));
            assert_eq!(d.wait, Duration::from_secs(wait));
        }
    });
    // The same through a per-key policy over a `Keyed` map, which reserves too.
    let keyed = format!("{name}_per_key");
    let map = Keyed::builder({
        let clock = clock.clone();
        move |_: &u8| {
            TokenBucket::builder(Limit::per_second(1.0).unwrap(), 1)
                .clock(clock.clone())
                .build()
        }
    })
    .clock(clock.clone())
    .build()
    .unwrap();
    let pk = Arc::new(per_key(
        keyed.as_str(),
        key::from_fn(|_: &Request<()>| Some(1u8)),
        map,
    ));
    metrics::with_local_recorder(&prometheus, || {
        for (enforced, wait) in [(true, 0), (true, 1), (true, 2), (false, 3)] {
            let d = now_or_never(Policy::<()>::decide(&pk, Some(1), ask(enforced)));
            assert_eq!(d.wait, Duration::from_secs(wait));
        }
    });
    let text = handle.render();
    for name in [name, keyed.as_str()] {
        let value = |series: &str| {
            let prefix = format!("{series}{{policy=\"{name}\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .map(|v| v.parse::<f64>().unwrap())
        };
        assert_eq!(value("turnstile_wait_seconds_count"), Some(2.0), "{text}");
        assert_eq!(value("turnstile_wait_seconds_sum"), Some(3.0), "{text}");
    }
}

#[cfg(feature = "metrics")]
#[test]
fn near_limit_counts_the_grants_that_leave_a_fifth_or_less() {
    use metrics_exporter_prometheus::PrometheusBuilder;
    let prometheus = PrometheusBuilder::new().build_recorder();
    let handle = prometheus.handle();
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let (g, k) = ("near_limit_global", "near_limit_per_key");
    // Burst 10, no refill: grants leave 9, 8, …, 0; at 0.8 the last three are near.
    let global_p = Arc::new(
        global(
            g,
            TokenBucket::builder(Limit::ZERO, 10)
                .clock(clock.clone())
                .build(),
        )
        .near_limit(0.8)
        .unwrap(),
    );
    let map = KeyedTokenBucket::builder(Limit::ZERO, 10)
        .clock(clock.clone())
        .build()
        .unwrap();
    let key_p = Arc::new(
        per_key(k, key::from_fn(|_: &Request<()>| Some(1u8)), map)
            .near_limit(0.8)
            .unwrap(),
    );
    for _ in 0..12 {
        let d = now_or_never(Policy::<()>::decide(&global_p, (), Ask::default()));
        assert!(d.report.items.is_empty(), "a report nobody asked for");
        let d = now_or_never(Policy::<()>::decide(&key_p, Some(1), Ask::default()));
        assert!(d.report.items.is_empty(), "a report nobody asked for");
    }
    metrics::with_local_recorder(&prometheus, crate::metrics::publish);
    let text = handle.render();
    let near = |name: &str| {
        let prefix = format!("turnstile_near_limit_total{{policy=\"{name}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map(|v| v.parse::<u64>().unwrap())
    };
    assert_eq!((near(g), near(k)), (Some(3), Some(3)), "{text}");
    for bad in [0.0, -0.5, 1.5, f64::NAN] {
        let p = global("x", TokenBucket::new(Limit::ZERO, 1)).near_limit(bad);
        assert!(matches!(p, Err(crate::ConfigError::NearLimitFraction(_))));
    }
}
