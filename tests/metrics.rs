//! The axum example (`examples/axum.rs`, included here as a module) served on loopback with
//! the Prometheus recorder installed: a real HTTP client drives allowed, refused and
//! shadow-refused traffic through its three policies, on a clock that stands still, and
//! the `/metrics` scrape must show each policy's decisions exactly.
//!
//! A test binary of its own: the recorder is process-wide, and [`turnstile::metrics::publish`]
//! adds up every live policy of a name, so no other binary's tests may share the process;
//! the tests here each name their policies apart. With them, the `tracing` events
//! (feature `tracing`): enforcement mode changes and refusal alarms, read by one
//! process-wide subscriber.
#![cfg(all(feature = "tower", feature = "axum", feature = "metrics"))]

#[allow(dead_code)]
#[path = "../examples/axum.rs"]
mod example;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use metrics_exporter_prometheus::PrometheusBuilder;
use turnstile::tower::{Enforcement, Mode};
use turnstile::{ManualClock, Nanos};

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Empty<bytes::Bytes>>;

/// GETs `path` from `server`: the status and the body.
async fn get(client: &HttpClient, server: SocketAddr, path: &str) -> (u16, String) {
    let uri = format!("http://{server}{path}").parse().unwrap();
    let resp = client.get(uri).await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

/// `n` requests to `/`: how many got each status.
async fn burst(client: &HttpClient, server: SocketAddr, n: usize) -> BTreeMap<u16, usize> {
    let mut by_status = BTreeMap::new();
    for _ in 0..n {
        *by_status
            .entry(get(client, server, "/").await.0)
            .or_default() += 1;
    }
    by_status
}

/// The `name` series of a scrape of the example's policies (the other tests' policies
/// share the process): labels (as written) to value.
fn series(scrape: &str, name: &str) -> BTreeMap<String, u64> {
    let prefix = format!("{name}{{");
    let ours = [
        "policy=\"all\"",
        "policy=\"per-ip\"",
        "policy=\"per-ip-strict\"",
    ];
    scrape
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter(|l| {
            ours.iter()
                .any(|p| l.starts_with(&format!("{p},")) || l.starts_with(&format!("{p}}}")))
        })
        .map(|l| {
            let (labels, value) = l.split_once("} ").unwrap();
            (labels.to_owned(), value.parse().unwrap())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_counts_every_decision_of_every_policy_exactly() {
    let prometheus = PrometheusBuilder::new().install_recorder().unwrap();
    // A clock that stands still: no token comes back between requests.
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let strict = Enforcement::shadow();
    let app = example::app(clock, Duration::ZERO, strict.clone(), prometheus);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = listener.local_addr().unwrap();
    let serving = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();

    // Before any request: no series at all.
    let (status, scrape) = get(&client, server, "/metrics").await;
    assert_eq!(status, 200);
    assert_eq!(
        series(&scrape, "turnstile_decisions_total"),
        BTreeMap::new()
    );

    // Shadow: the strict limit (burst 5) lets all 7 through, 2 of them shadow-refused.
    assert_eq!(burst(&client, server, 7).await, BTreeMap::from([(200, 7)]));
    // Enforced: it refuses the next 3; "per-ip" granted them first and gets them back.
    strict.set(Mode::Enforce).unwrap();
    assert_eq!(burst(&client, server, 3).await, BTreeMap::from([(429, 3)]));
    // Shadow again: "per-ip" (burst 20, 7 spent) grants 13 and refuses 2; the strict limit
    // shadow-refuses the 13 it sees.
    strict.set(Mode::Shadow).unwrap();
    assert_eq!(
        burst(&client, server, 15).await,
        BTreeMap::from([(200, 13), (429, 2)])
    );

    let (_, scrape) = get(&client, server, "/metrics").await;
    let want = [
        (r#"policy="all",decision="allowed",mode="enforce""#, 20),
        (r#"policy="per-ip",decision="allowed",mode="enforce""#, 23),
        (r#"policy="per-ip",decision="refused",mode="enforce""#, 2),
        (
            r#"policy="per-ip-strict",decision="allowed",mode="shadow""#,
            5,
        ),
        (
            r#"policy="per-ip-strict",decision="refused",mode="enforce""#,
            3,
        ),
        (
            r#"policy="per-ip-strict",decision="shadow_refused",mode="shadow""#,
            15,
        ),
    ];
    let want: BTreeMap<String, u64> = want.iter().map(|(l, v)| (l.to_string(), *v)).collect();
    assert_eq!(
        series(&scrape, "turnstile_decisions_total"),
        want,
        "scrape:\n{scrape}"
    );
    // Both per-IP maps hold the one client, under their default bound; nothing evicted
    // (the clock stands still: no bucket refills to idle), no new key turned away.
    for (name, value) in [
        ("turnstile_keys", 1),
        ("turnstile_keys_max", 1 << 20),
        ("turnstile_evictions_total", 0),
        ("turnstile_map_full_total", 0),
    ] {
        let want = BTreeMap::from([
            (r#"policy="per-ip""#.to_string(), value),
            (r#"policy="per-ip-strict""#.to_string(), value),
        ]);
        assert_eq!(series(&scrape, name), want, "{name}:\n{scrape}");
    }
    assert!(scrape.contains("# TYPE turnstile_keys gauge"), "{scrape}");
    assert!(
        scrape.contains("# TYPE turnstile_decisions_total counter"),
        "{scrape}"
    );
    // A second scrape, with no request between: the same totals (publishing twice adds
    // nothing).
    let (_, again) = get(&client, server, "/metrics").await;
    assert_eq!(series(&again, "turnstile_decisions_total"), want);
    serving.abort();
}

/// Every turnstile event of the process, as `LEVEL field=value ...` lines: one global
/// subscriber, installed by the first test that asks (tracing caches each call site's
/// interest process-wide, so a subscriber set per test could miss events another test's
/// thread disabled first).
#[cfg(feature = "tracing")]
fn events() -> &'static std::sync::Mutex<Vec<String>> {
    use std::sync::{Mutex, OnceLock};
    static LINES: OnceLock<&'static Mutex<Vec<String>>> = OnceLock::new();
    LINES.get_or_init(|| {
        let lines: &'static Mutex<Vec<String>> = Box::leak(Box::default());
        let subscriber = events::Events(move |event: &tracing::Event<'_>| {
            lines.lock().unwrap().push(events::line(event));
        });
        tracing::subscriber::set_global_default(subscriber).unwrap();
        lines
    })
}

#[cfg(feature = "tracing")]
#[path = "common/events.rs"]
mod events;

/// The events logged so far that contain `needle`.
#[cfg(feature = "tracing")]
fn logged(needle: &str) -> Vec<String> {
    let lines = events().lock().unwrap();
    lines
        .iter()
        .filter(|l| l.contains(needle))
        .cloned()
        .collect()
}

#[cfg(feature = "tracing")]
#[test]
fn a_mode_change_and_a_refused_one_are_events() {
    events();
    let e = Enforcement::shadow().named("rollout-events-test");
    e.set(Mode::Fraction(0.5)).unwrap();
    assert!(e.set(Mode::Fraction(2.0)).is_err());
    assert_eq!(e.mode(), Mode::Fraction(0.5));
    let lines = logged("rollout-events-test");
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[0].starts_with("INFO"), "{lines:?}");
    assert!(
        lines[0].contains("from=Shadow to=Fraction(0.5)"),
        "{lines:?}"
    );
    assert!(lines[1].starts_with("WARN"), "{lines:?}");
    assert!(lines[1].contains("mode=Fraction(2.0)"), "{lines:?}");
}

#[cfg(feature = "tracing")]
#[test]
fn a_policy_refusing_past_its_alarm_warns_once_a_window_with_the_last_key() {
    use std::sync::Arc;
    use turnstile::tower::{global, key, per_key, Ask, Policy};
    use turnstile::{KeyedTokenBucket, Limit, TokenBucket};
    events();
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let req = |k: &str| {
        let mut r = http::Request::new(());
        r.headers_mut().insert("x-client", k.parse().unwrap());
        r
    };
    // One permit per client, never refilled; an alarm at 5 refusals a second.
    let map = KeyedTokenBucket::builder(Limit::ZERO, 1)
        .clock(clock.clone())
        .build()
        .unwrap();
    let p = Arc::new(
        per_key(
            "alarm-keys-test",
            key::Header("x-client".parse().unwrap()),
            map,
        )
        .alert_refusals_with_keys(5),
    );
    let all = Arc::new(
        global(
            "alarm-global-test",
            TokenBucket::builder(Limit::ZERO, 1)
                .clock(clock.clone())
                .build(),
        )
        .alert_refusals(5),
    );
    let decide = |k: &str| {
        let key = Policy::<()>::key(&*p, &req(k));
        let d = Policy::<()>::decide(&p, key, Ask::default()).into_inner();
        let g = Policy::<()>::decide(&all, (), Ask::default()).into_inner();
        (d.result.is_ok(), g.result.is_ok())
    };
    assert_eq!(decide("abuser"), (true, true));
    // The first refusal opens the alarm's first window; 10 more within 0.5 s.
    for _ in 0..11 {
        assert_eq!(decide("abuser"), (false, false));
        clock.advance(Duration::from_millis(50));
    }
    assert!(logged("alarm-").is_empty(), "{:?}", logged("alarm-"));
    // 0.6 s later a refusal of another client closes the window: 11 refusals in 1.1 s, past 5 a
    // second. Named: the last key refused.
    clock.advance(Duration::from_millis(550));
    assert!(decide("other").0);
    assert_eq!(decide("other"), (false, false));
    let keyed = logged("alarm-keys-test");
    assert_eq!(keyed.len(), 1, "{keyed:?}");
    assert!(keyed[0].starts_with("WARN"), "{keyed:?}");
    assert!(keyed[0].contains("refusals=11"), "{keyed:?}");
    assert!(keyed[0].contains("mode=\"enforce\""), "{keyed:?}");
    assert!(keyed[0].contains(r#"key="other""#), "{keyed:?}");
    let global = logged("alarm-global-test");
    assert_eq!(global.len(), 1, "{global:?}");
    // The global policy's window closed at the first of the two (its refusal of "other").
    assert!(
        global[0].contains("refusals=11") && !global[0].contains("key="),
        "{global:?}"
    );
    // A slow window (one refusal in 1.5 s): under the threshold, nothing more.
    clock.advance(Duration::from_millis(1500));
    assert_eq!(decide("other"), (false, false));
    assert_eq!(logged("alarm-").len(), 2, "{:?}", logged("alarm-"));
}
