use super::*;

/// In a keyed map's slot (a cache line's alignment, the map's state word first), a
/// compact smooth limiter's state word, all that a refusal reads, is in the slot's first
/// line, with the slot's state word.
#[cfg(feature = "keyed")]
#[test]
fn a_keyed_refusal_reads_one_line_of_its_slot() {
    let bursty = crate::keyed::word_ends_in_slot(
        || {
            SmoothBursty::builder(10.0)
                .clock(crate::ManualClock::default())
                .build_compact()
                .unwrap()
        },
        |l| [("bursty state", (&raw const *l.core.state).cast(), 16)],
    );
    let warming = crate::keyed::word_ends_in_slot(
        || {
            SmoothWarmingUp::builder(10.0, Duration::from_secs(1))
                .clock(crate::ManualClock::default())
                .build_compact()
                .unwrap()
        },
        |l| [("warming state", (&raw const *l.core.state).cast(), 16)],
    );
    for (name, end) in bursty.into_iter().chain(warming) {
        assert!(end <= 64, "{name} ends at byte {end}");
    }
}

#[test]
fn packing_round_trips() {
    let w = pack(u64::MAX, FRAC_ONE, EPOCH_MASK);
    assert_eq!(next_free(w), u64::MAX);
    assert_eq!(frac(w), FRAC_ONE);
    assert_eq!(epoch(w), EPOCH_MASK);
    let w = pack(12345, 777, 3);
    assert_eq!((next_free(w), frac(w), epoch(w)), (12345, 777, 3));
}

#[test]
fn fractions_round_trip_to_within_half_a_unit() {
    let cfg = Config::new(
        Kind::Bursty {
            max_burst_seconds: 1.0,
        },
        3.0,
        0,
    );
    assert_eq!(cfg.stored(cfg.frac_of(3.0)), 3.0);
    assert_eq!(cfg.stored(cfg.frac_of(1.5)), 1.5);
    assert_eq!(cfg.stored(cfg.frac_of(0.0)), 0.0);
    for x in [0.1, 1.0, 2.0, 2.999_999] {
        let back = cfg.stored(cfg.frac_of(x));
        assert!((x - back).abs() <= 3.0 / FRAC_SCALE, "{x} -> {back}");
    }
    // Idle time in fraction units does not depend on the rate: half a 1 s burst.
    let (_, f) = cfg.resync(pack(0, 0, 0), 500_000_000);
    assert_eq!(f, FRAC_ONE / 2);
}

#[test]
fn config_words_round_trip() {
    // Every field survives its slot, and a charge's prefix holds every field a
    // reservation reads.
    for kind in [
        Kind::Bursty {
            max_burst_seconds: 1.5,
        },
        Kind::WarmingUp {
            warmup_ns: 4e9,
            cold_factor: 3.0,
        },
    ] {
        for rate in [1e-3, 2.0, 1e6, f64::INFINITY] {
            let c = Config::new(kind, rate, 3);
            let warming = matches!(kind, Kind::WarmingUp { .. });
            let back = Config::from_words(3, c.to_words(), warming);
            assert_eq!(format!("{back:?}"), format!("{c:?}"));
            let w = c.to_words();
            let hot = if warming {
                let p: [u64; CHARGE_WORDS_WARMING] = std::array::from_fn(|i| w[i]);
                Config::from_words(3, p, warming)
            } else {
                let p: [u64; CHARGE_WORDS_BURSTY] = std::array::from_fn(|i| w[i]);
                Config::from_words(3, p, warming)
            };
            let f = |c: &Config| {
                format!(
                    "{:?}",
                    (
                        c.stable_ns,
                        c.accrual,
                        c.units_per_permit,
                        c.unit,
                        c.max_permits,
                        c.threshold,
                        c.slope,
                        c.inf,
                        c.scale,
                        c.warming
                    )
                )
            };
            assert_eq!(f(&hot), f(&c), "{kind:?} {rate}");
        }
    }
}

#[test]
fn no_config_field_is_nan() {
    let kinds = [
        Kind::Bursty {
            max_burst_seconds: 0.0,
        },
        Kind::Bursty {
            max_burst_seconds: 1.0,
        },
        Kind::WarmingUp {
            warmup_ns: 1.0,
            cold_factor: 1.0,
        },
        Kind::WarmingUp {
            warmup_ns: 1e19,
            cold_factor: 1e300,
        },
    ];
    for kind in kinds {
        for rate in [
            f64::MIN_POSITIVE / 8.0,
            1e-300,
            1.0,
            1e300,
            f64::MAX,
            f64::INFINITY,
        ] {
            let c = Config::new(kind, rate, 0);
            for x in [
                c.rate,
                c.stable_ns,
                c.max_permits,
                c.cool_down_ns,
                c.threshold,
                c.slope,
                c.scale,
                c.accrual,
                c.units_per_permit,
            ] {
                assert!(!x.is_nan(), "{kind:?} {rate}: {c:?}");
            }
        }
    }
}
