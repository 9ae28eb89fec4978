//! `Fallback`'s switches are `tracing` events: a warning with the error on the way to the
//! fallback, an info with the outage's length on the way back; misconfigurations are error
//! events, at most one a second, counting the ones suppressed. Alone in its own test binary:
//! `tracing` caches each call site's interest process-wide when it is first hit, and another
//! test's thread hitting the same call site first, with no subscriber, while this one installs
//! its own, can leave the site disabled for this test (a rare, real race seen in CI).
#![cfg(feature = "redis")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::redis_counter::*;
use common::redis_server::RedisServer;
use turnstile::redis::{Fallback, Mode};

/// Every event of turnstile's with its level and fields, as `LEVEL field=value ...` lines.
#[derive(Clone, Default)]
struct Events(Arc<std::sync::Mutex<Vec<String>>>);

impl Events {
    /// The subscriber that records into this.
    fn subscriber(
        &self,
    ) -> common::events::Events<impl Fn(&tracing::Event<'_>) + Send + Sync + use<>> {
        let lines = self.0.clone();
        common::events::Events(move |event: &tracing::Event<'_>| {
            lines.lock().unwrap().push(common::events::line(event));
        })
    }
}

#[tokio::test]
async fn each_switch_is_a_tracing_event() {
    let Some(mut server) = RedisServer::start("each_switch_is_a_tracing_event") else {
        return;
    };
    // A current-thread runtime: the health check runs on this thread, under this default.
    let events = Events::default();
    let _guard = tracing::subscriber::set_default(events.subscriber());
    guarded(async {
        let c = Counter::new(&server, 5, Duration::from_secs(60), Kind::Count).await;
        let fb = Fallback::builder(c).timeout(TIMEOUT).build().unwrap();
        assert!(answered(&fb, "t").await);
        assert!(
            events.0.lock().unwrap().is_empty(),
            "nothing to say in Redis mode"
        );

        server.kill();
        assert!(answered(&fb, "t").await);
        assert!(answered(&fb, "t").await);
        {
            let seen = events.0.lock().unwrap();
            assert_eq!(seen.len(), 1, "one event for the switch: {seen:?}");
            assert!(seen[0].starts_with("WARN"), "{seen:?}");
            assert!(
                seen[0].contains(" error="),
                "the error is in the event: {seen:?}"
            );
        }

        server.restart();
        wait_for(&fb, Mode::Redis, BACK_WITHIN).await;
        {
            let seen = events.0.lock().unwrap();
            assert_eq!(seen.len(), 2, "{seen:?}");
            assert!(seen[1].starts_with("INFO"), "{seen:?}");
            assert!(seen[1].contains(" outage="), "{seen:?}");
        }

        // Misconfigurations: an ERROR event at most once a second, each counting the ones
        // suppressed since the last; together they account for every one.
        events.0.lock().unwrap().clear();
        let broken = Counter::new(&server, 5, Duration::from_secs(60), Kind::ScriptError).await;
        let fb = Fallback::builder(broken).timeout(TIMEOUT).build().unwrap();
        let t = std::time::Instant::now();
        for _ in 0..30 {
            let _ = answered(&fb, "m").await;
        }
        let took = t.elapsed();
        // Past the second, one more: its event reports the rest.
        while t.elapsed() < Duration::from_millis(1100) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = answered(&fb, "m").await;
        let seen = events.0.lock().unwrap();
        assert!(seen.iter().all(|e| e.starts_with("ERROR")), "{seen:?}");
        let suppressed: u64 = seen
            .iter()
            .map(|e| {
                let n = e.split(" suppressed=").nth(1).expect("a suppressed field");
                n.split(' ').next().unwrap().parse::<u64>().unwrap()
            })
            .sum();
        assert_eq!(seen.len() as u64 + suppressed, 31, "{seen:?}");
        assert_eq!(fb.stats().misconfigurations, 31);
        assert!(
            seen.len() as u64 <= took.as_secs() + 2,
            "{} events for 31 errors in {took:?}: not rate-limited",
            seen.len()
        );
        assert!(
            seen.len() >= 2,
            "the last event reports the suppressed: {seen:?}"
        );
    })
    .await;
}
