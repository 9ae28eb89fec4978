//! `per_key`'s map is bounded by default and sweeps off the request path.
//!
//! * A check never runs a sweep inline once `per_key` owns the map: the periodic sweep is the
//!   sweeper thread's, and a full map wakes that thread instead of sweeping in the check.
//!   The clock here parks the sweeper thread whenever it reads the time, so what a check does
//!   inline is all that can have happened when it returns.
//! * Under a flood of distinct keys, from two threads, with sweeps evicting and purging, the
//!   map never holds more than its bound, and an inline table never grows past the bound's.
#![cfg(feature = "tower")]

use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use turnstile::tower::{key, per_key, Ask, PerKey, PerKeyMap, Policy};
use turnstile::{Clock, Keyed, KeyedTokenBucket, Limit, ManualClock, Nanos, TokenBucket};

/// A manual clock that blocks the sweeper thread ("turnstile-sweeper") in `now` until the
/// gate opens, so a sweep can only happen where the test lets it.
#[derive(Clone, Default)]
struct GatedClock {
    time: ManualClock,
    open: Arc<(Mutex<bool>, Condvar)>, // a test's gate, not a limiter's path
}

impl GatedClock {
    fn open(&self) {
        let (open, cv) = &*self.open;
        *open.lock().unwrap() = true;
        cv.notify_all();
    }
}

impl Clock for GatedClock {
    fn now(&self) -> Nanos {
        if std::thread::current().name() == Some("turnstile-sweeper") {
            let (open, cv) = &*self.open;
            let mut open = open.lock().unwrap();
            while !*open {
                open = cv.wait(open).unwrap();
            }
        }
        self.time.now()
    }
}

fn ip(i: u64) -> IpAddr {
    IpAddr::V6(Ipv6Addr::from((0x2001_0db8u128 << 96) | u128::from(i)))
}

fn decide<M: PerKeyMap<IpAddr>>(p: &Arc<PerKey<IpAddr, key::PeerIp, M>>, i: u64) -> bool {
    Policy::<()>::decide(p, Some(ip(i)), Ask::default())
        .into_inner()
        .result
        .is_ok()
}

fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn inline(
    clock: &GatedClock,
    max_keys: u64,
) -> KeyedTokenBucket<IpAddr, std::collections::hash_map::RandomState, GatedClock> {
    KeyedTokenBucket::builder(Limit::per_second(1.0).unwrap(), 1)
        .max_keys(max_keys)
        .sweep_every(Duration::from_secs(3600))
        .clock(clock.clone())
        .build()
        .unwrap()
}

type Compact = TokenBucket<GatedClock, turnstile::Compact>;

fn keyed(clock: &GatedClock, max_keys: u64) -> Keyed<IpAddr, Compact, GatedClock> {
    let c = clock.clone();
    Keyed::builder(move |_: &IpAddr| {
        TokenBucket::builder(Limit::per_second(1.0).unwrap(), 1)
            .clock(c.clone())
            .build_compact()
    })
    .max_keys(max_keys)
    .sweep_every(Duration::from_secs(3600))
    .clock(clock.clone())
    .build()
    .unwrap()
}

/// A sweep is due (the clock is past `sweep_every`, and key 1 idle), yet the check that
/// finds it due does not run it.
fn no_periodic_sweep_inline<M: PerKeyMap<IpAddr>>(clock: GatedClock, map: M, len: fn(&M) -> usize) {
    let p = Arc::new(per_key("t", key::PeerIp, map));
    assert!(decide(&p, 1));
    clock.time.advance(Duration::from_secs(2 * 3600));
    assert!(decide(&p, 2));
    assert_eq!(len(p.map()), 2, "the check swept inline: key 1 was evicted");
    clock.open();
}

#[test]
fn per_key_never_sweeps_in_a_check() {
    let c = GatedClock::default();
    no_periodic_sweep_inline(c.clone(), inline(&c, 100), KeyedTokenBucket::len);
    let c = GatedClock::default();
    no_periodic_sweep_inline(c.clone(), keyed(&c, 100), Keyed::len);
}

/// The map is full of idle keys: a new key is refused (the check woke the sweeper rather
/// than sweeping), and admitted once the sweeper, let through, has swept.
fn full_map_wakes_the_sweeper<M: PerKeyMap<IpAddr>>(
    clock: GatedClock,
    map: M,
    len: fn(&M) -> usize,
) {
    let p = Arc::new(per_key("t", key::PeerIp, map));
    assert!(decide(&p, 1));
    assert!(decide(&p, 2));
    // Both idle, and past the early-sweep gap (a tenth of `sweep_every`).
    clock.time.advance(Duration::from_secs(600));
    assert!(!decide(&p, 3), "the check swept inline to make room");
    assert_eq!(len(p.map()), 2);
    clock.open();
    wait_for("the sweeper's sweep", || len(p.map()) == 0);
    assert!(decide(&p, 3));
    assert_eq!(len(p.map()), 1);
}

#[test]
fn a_full_map_wakes_the_sweeper_instead_of_sweeping() {
    let c = GatedClock::default();
    full_map_wakes_the_sweeper(c.clone(), inline(&c, 2), KeyedTokenBucket::len);
    let c = GatedClock::default();
    full_map_wakes_the_sweeper(c.clone(), keyed(&c, 2), Keyed::len);
}

/// The sweeper thread ends when the policy is dropped (it holds only a `Weak`).
#[test]
fn the_sweeper_ends_with_the_policy() {
    let c = GatedClock::default();
    c.open();
    let map = Arc::new(inline(&c, 10));
    let sweeper = map.spawn_sweeper();
    drop(map);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sweeper.is_finished() {
        assert!(Instant::now() < deadline, "the sweeper outlived its map");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The default key bound, the one the docs state: 2^20 keys.
#[test]
fn the_maps_are_bounded_by_default() {
    let l = Limit::per_second(1.0).unwrap();
    assert_eq!(KeyedTokenBucket::<u64>::new(l, 1).max_keys(), 1 << 20);
    assert_eq!(
        Keyed::new(move |_: &u64| TokenBucket::new(l, 1)).max_keys(),
        1 << 20
    );
}

/// Two threads flood distinct keys while a third advances the clock and a fourth watches;
/// the sweeper evicts idle keys and purges the table. The map never holds more than its
/// bound, nor an inline table more slots than the bound needs.
fn flood<M: PerKeyMap<IpAddr>>(
    clock: GatedClock,
    map: M,
    bound: usize,
    len: fn(&M) -> usize,
    slots: fn(&M) -> usize,
    max_slots: usize,
) {
    clock.open();
    let p = Arc::new(per_key("t", key::PeerIp, map));
    let stop = AtomicBool::new(false);
    let next = AtomicU64::new(0);
    let admitted = AtomicU64::new(0);
    // Until sweeps have made room again and again: three bounds' worth of keys admitted.
    let enough = 3 * bound as u64;
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut peak_len, mut peak_slots) = (0, 0);
    std::thread::scope(|s| {
        let floods: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    while admitted.load(Ordering::Relaxed) < enough
                        && Instant::now() < deadline
                        && !stop.load(Ordering::Relaxed)
                    {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if decide(&p, i) {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                clock.time.advance(Duration::from_millis(50));
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        while floods.iter().any(|f| !f.is_finished()) {
            peak_len = peak_len.max(len(p.map()));
            peak_slots = peak_slots.max(slots(p.map()));
            if peak_len > bound || peak_slots > max_slots {
                break;
            }
            std::thread::yield_now();
        }
        stop.store(true, Ordering::Relaxed);
    });
    peak_len = peak_len.max(len(p.map()));
    peak_slots = peak_slots.max(slots(p.map()));
    assert!(peak_len <= bound, "{peak_len} keys held, bound {bound}");
    assert!(
        peak_slots <= max_slots,
        "{peak_slots} slots, at most {max_slots}"
    );
    let admitted = admitted.load(Ordering::Relaxed);
    assert!(
        admitted >= enough,
        "only {admitted} admitted before the deadline"
    );
    eprintln!(
        "{} keys sent, {admitted} admitted, at most {peak_len} held in {peak_slots} slots",
        next.load(Ordering::Relaxed)
    );
}

#[test]
fn a_flood_never_holds_more_than_the_bound() {
    // 1500 keys need 2048 slots (at most 7/8 used); growth to twice the keys alone would take
    // the table to 4096.
    let c = GatedClock::default();
    let map = KeyedTokenBucket::builder(Limit::per_second(1.0).unwrap(), 1)
        .max_keys(1500)
        .sweep_every(Duration::from_millis(20))
        .clock(c.clone())
        .build()
        .unwrap();
    flood(
        c,
        map,
        1500,
        KeyedTokenBucket::len,
        KeyedTokenBucket::capacity,
        2048,
    );
    let c = GatedClock::default();
    let t = c.clone();
    let map = Keyed::builder(move |_: &IpAddr| {
        TokenBucket::builder(Limit::per_second(1.0).unwrap(), 1)
            .clock(t.clone())
            .build_compact()
    })
    .max_keys(1024)
    .sweep_every(Duration::from_millis(20))
    .clock(c.clone())
    .build()
    .unwrap();
    flood(c, map, 1024, Keyed::len, |_| 0, 0);
}

/// A table at its bound with dead slots purges them instead of growing: 1500 keys need 2048
/// slots; 1200 live and 300 dead plus 300 new would take a growing table to 4096.
#[test]
fn a_table_at_the_bound_purges_instead_of_growing() {
    let k = KeyedTokenBucket::<u64, _, _>::builder(Limit::per_second(1.0).unwrap(), 1)
        .max_keys(1500)
        .sweep_every(Duration::MAX)
        .clock(ManualClock::default())
        .build()
        .unwrap();
    for key in 0..300 {
        k.check_n_at(&key, Nanos::ZERO, 1).unwrap();
    }
    for key in 300..1500 {
        k.check_n_at(&key, Nanos::new(500_000_000), 1).unwrap();
    }
    assert_eq!(k.capacity(), 2048);
    // Keys 0..300 are full again at 1 s; the others at 1.5 s. Fewer dead than live: no purge.
    assert_eq!(k.evict_idle_at(Nanos::new(1_000_000_000)), 300);
    assert_eq!(k.capacity(), 2048);
    for key in 1500..1800 {
        k.check_n_at(&key, Nanos::new(1_000_000_000), 1).unwrap();
    }
    assert_eq!(k.len(), 1500);
    assert_eq!(k.capacity(), 2048, "the table grew past the bound's");
}
