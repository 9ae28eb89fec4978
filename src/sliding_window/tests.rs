use super::rule::MAX_PERIOD_NS;
use super::*;

#[test]
fn packing_round_trips_at_the_extremes() {
    for c in [
        Counts {
            k: 0,
            prev: 0,
            curr: 0,
        },
        Counts {
            k: u64::MAX,
            prev: u32::MAX,
            curr: u32::MAX,
        },
        Counts {
            k: 1,
            prev: 2,
            curr: 3,
        },
    ] {
        assert_eq!(Counts::unpack(c.pack()), c);
    }
}

/// The division-free `view` places every reading as `now / P` does, at the edges of the
/// state's window and the next one, before it, far after it, and at the extremes.
#[test]
fn the_view_without_division_is_the_view_by_division() {
    let periods = [
        1u128,
        2,
        3,
        1000,
        10_000_000,
        1 << 63,
        (1 << 63) + 1,
        u64::MAX.into(),
    ];
    let mut checked = 0;
    for p in periods.into_iter().chain([MAX_PERIOD_NS]) {
        let r = Rule { quota: 7, p };
        let p64 = u64::try_from(p).unwrap_or(u64::MAX);
        for k in [
            0,
            1,
            2,
            3,
            1000,
            u64::MAX / p64,
            u64::MAX / p64 - 1,
            u64::MAX,
        ] {
            let s = Counts {
                k,
                prev: 3,
                curr: 5,
            };
            let start = k.saturating_mul(p64);
            let mut times = vec![0, 1, u64::MAX, u64::MAX - 1, start];
            let two = p64.saturating_mul(2);
            for d in [
                1,
                p64 - 1,
                p64,
                p64.saturating_add(1),
                two - 1,
                two,
                two.saturating_add(p64),
            ] {
                times.extend([start.saturating_add(d), start.saturating_sub(d)]);
            }
            for now in times {
                let (a, b) = (
                    r.view(s, Nanos::new(now)),
                    r.view_by_division(s, Nanos::new(now)),
                );
                assert_eq!(
                    (a.j, a.e, a.prev, a.curr),
                    (b.j, b.e, b.prev, b.curr),
                    "P = {p}, k = {k}, now = {now}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 1000);
}

/// In a keyed map's slot (a cache line's alignment, the map's state word first), a
/// compact limiter's state word and rule, every word a check reads, are in the slot's
/// first line, with the slot's state word.
#[cfg(feature = "keyed")]
#[test]
fn a_keyed_check_reads_one_line_of_its_slot() {
    let make = || {
        SlidingWindow::builder(1, Duration::from_secs(1))
            .clock(crate::ManualClock::default())
            .build_compact()
            .unwrap()
    };
    let ends = crate::keyed::word_ends_in_slot(make, |l| {
        let state: *const AtomicU128 = &*l.state;
        [
            ("state", state.cast(), 16),
            ("p", (&raw const l.rule.p).cast(), 16),
            ("quota", (&raw const l.rule.quota).cast(), 4),
        ]
    });
    for (name, end) in ends {
        assert!(end <= 64, "{name} ends at byte {end}");
    }
}

#[test]
fn huge_periods_behave_as_two_to_the_64() {
    let r = Rule::new(u32::MAX, Duration::MAX);
    assert_eq!(r.p, MAX_PERIOD_NS);
    let s = Counts {
        k: 0,
        prev: u32::MAX,
        curr: u32::MAX,
    };
    let v = r.view(s, Nanos::MAX);
    assert_eq!((v.j, v.prev, v.curr), (0, u32::MAX, u32::MAX));
    assert!(!r.fits(&v, u32::MAX));
    assert_eq!(r.retry_at(&v, 1), None);
    assert_eq!(r.resets_at(&v, Nanos::MAX), Nanos::MAX);
}
