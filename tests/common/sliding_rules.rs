//! The rules of the sliding-window counter (src/sliding_window.rs module docs) as tests on
//! any limiter with `SlidingWindow`'s methods: the lock-free `SlidingWindow` and its mutex
//! twin (`tests/sliding_window/semantics.rs`), and one key of a `KeyedSlidingWindow`
//! (`tests/keyed/sliding.rs`). One test per rule, with vectors computed by hand; times are
//! explicit (`_at` forms) unless the test is about the clock.
//!
//! The invoking file defines `at`, `MS`, `SEC`, `T0` (the start of window 1000, period 1 s,
//! the limiter's clock reading at construction) and imports `Clock`, `ConfigError`,
//! `ManualClock`, `Nanos`, `WindowStatus` and whatever traits its type's methods need.

/// `mod $module` of the rules' tests on the limiter type at `$path` (generic over its clock:
/// `builder(quota, period).clock(..).build()`, `new`, and `SlidingWindow`'s checks and reads).
macro_rules! shared_rules {
    ($module:ident, $($path:tt)+) => {
        mod $module {
            use super::*;
            use $($path)+ as Window;

            type Sw = Window<ManualClock>;

            fn sw(quota: u32, period: Duration) -> Sw {
                Window::try_from(turnstile::SlidingWindow::builder(quota, period)
                    .clock(ManualClock::new(at(T0))))
                    .unwrap()
            }

            /// Quota 5 per second.
            fn five() -> Sw {
                sw(5, Duration::from_secs(1))
            }

            fn retry(l: &Sw, now: u64, n: u32) -> Option<Nanos> {
                l.check_n_at(at(now), n).unwrap_err().retry_at()
            }

            #[test]
            fn quota_zero_and_period_zero_are_typed_errors() {
                let e = Window::try_from(turnstile::SlidingWindow::builder(0, Duration::from_secs(1))).unwrap_err();
                assert_eq!(e, ConfigError::ZeroQuota);
                let e = Window::try_from(turnstile::SlidingWindow::builder(1, Duration::ZERO)).unwrap_err();
                assert_eq!(e, ConfigError::ZeroPeriod);
                // The quota is checked first.
                let e = Window::try_from(turnstile::SlidingWindow::builder(0, Duration::ZERO)).unwrap_err();
                assert_eq!(e, ConfigError::ZeroQuota);
                let e = Window::new(0, Duration::from_secs(1)).unwrap_err();
                assert_eq!(e, ConfigError::ZeroQuota);
                let l = five();
                assert_eq!((l.quota(), l.period()), (5, Duration::from_secs(1)));
            }

            #[test]
            fn a_window_holds_the_quota_and_not_one_more() {
                let l = five();
                for i in 0..5 {
                    assert!(l.allow_at(at(T0 + i * 100 * MS)), "grant {i}");
                }
                assert!(!l.allow_at(at(T0 + 500 * MS)));
                assert!(!l.allow_at(at(T0 + SEC - 1)), "the last nanosecond of the window");
            }

            #[test]
            fn the_previous_window_weighs_by_its_overlap() {
                let l = five();
                assert!(l.allow_n_at(at(T0), 5));
                // 1.5 s: e = 0.5 s, prev 5 weighs 2.5. 2.5 + 2 = 4.5 <= 5; 2.5 + 3 = 5.5 > 5.
                let t = T0 + 1_500 * MS;
                assert!(!l.allow_n_at(at(t), 3));
                assert!(l.allow_at(at(t))); // 3.5
                assert!(l.allow_at(at(t))); // 4.5
                assert!(!l.allow_at(at(t))); // 5.5
                // 1.9 s: 5 * 0.1 + 2 = 2.5: 2 more (4.5), not 3.
                let t = T0 + 1_900 * MS;
                assert!(!l.allow_n_at(at(t), 3));
                assert!(l.allow_n_at(at(t), 2));
                // 2.0 s: window 1002, prev = 4 (window 1001's), weighs fully: 1 fits.
                let t = T0 + 2 * SEC;
                assert!(!l.allow_n_at(at(t), 2));
                assert!(l.allow_n_at(at(t), 1));
            }

            #[test]
            fn the_weight_decays_linearly_to_the_nanosecond() {
                // prev 5, n 1: 5 (P - e) + P <= 5P  <=>  e >= P / 5 = 200 ms exactly.
                let l = five();
                assert!(l.allow_n_at(at(T0 + 999 * MS), 5));
                assert!(!l.allow_at(at(T0 + SEC)));
                assert!(!l.allow_at(at(T0 + SEC + 200 * MS - 1)));
                assert!(l.allow_at(at(T0 + SEC + 200 * MS)));
                // Uneven: quota 3, period 1000 ns, prev 3, n 1: 3 e >= 1000, e >= 333.3 -> 334.
                let l = sw(3, Duration::from_nanos(1_000));
                assert!(l.allow_n_at(at(T0), 3));
                let start = T0 + 1_000;
                assert!(!l.allow_at(at(start + 333)));
                assert!(l.allow_at(at(start + 334)));
            }

            #[test]
            fn two_windows_later_everything_is_forgotten() {
                let l = five();
                assert!(l.allow_n_at(at(T0 + 999 * MS), 5));
                // One window later the 5 still weigh (fully at its start)...
                assert!(!l.allow_at(at(T0 + SEC)));
                // ...two windows later they are gone, at the first nanosecond.
                assert!(l.allow_n_at(at(T0 + 2 * SEC), 5));
                assert!(!l.allow_at(at(T0 + 2 * SEC)));
                // A long jump forgets both windows.
                assert!(l.allow_n_at(at(T0 + 100 * SEC + 1), 5));
            }

            #[test]
            fn retry_times_are_exact() {
                let l = five();
                assert!(l.allow_n_at(at(T0), 5));
                // Full window: next window, when 5 (P - e) + P <= 5P: e = 200 ms.
                assert_eq!(retry(&l, T0 + 500 * MS, 1), Some(at(T0 + 1_200 * MS)));
                // 2: 5 (P - e) + 2P <= 5P: e = 400 ms.
                assert_eq!(retry(&l, T0 + 500 * MS, 2), Some(at(T0 + 1_400 * MS)));
                // 5: never in the next window (5 (P - e) <= 0), so the window after.
                assert_eq!(retry(&l, T0 + 500 * MS, 5), Some(at(T0 + 2 * SEC)));
                assert_eq!(retry(&l, T0 + 500 * MS, 6), None);
                // In-window retry: at 1.0 s prev 5 weighs fully; 1 fits from 1.2 s.
                assert_eq!(retry(&l, T0 + SEC, 1), Some(at(T0 + 1_200 * MS)));
                assert!(!l.allow_at(at(T0 + 1_200 * MS - 1)));
                assert!(l.allow_at(at(T0 + 1_200 * MS)));
                // Now (1001, prev 5, curr 1). n 1: 5 (P - e) + 2P <= 5P: e = 400 ms.
                assert_eq!(retry(&l, T0 + 1_200 * MS, 1), Some(at(T0 + 1_400 * MS)));
                // n 4: curr + n = 5 = quota: never in this window (prev > 0); next window
                // prev' = 1: (P - e) + 4P <= 5P at e = 0: its start.
                assert_eq!(retry(&l, T0 + 1_200 * MS, 4), Some(at(T0 + 2 * SEC)));
                // The denials above wrote nothing.
                assert_eq!(l.status_at(at(T0 + 1_200 * MS)).remaining, 0);
                assert!(l.allow_at(at(T0 + 1_400 * MS)));
            }

            #[test]
            fn retry_times_are_exact_when_the_window_cannot_fit_it() {
                let l = five();
                assert!(l.allow_n_at(at(T0), 2));
                // 1.0 s: prev 2 weighs 2: 3 fit.
                assert!(l.allow_n_at(at(T0 + SEC), 3));
                // 1.5 s: 1 + 3 = 4. n 2: curr + n = 5, never in window 1001 while prev
                // weighs; window 1002: prev' 3, 3 (P - e) + 2P <= 5P at e = 0.
                assert_eq!(retry(&l, T0 + 1_500 * MS, 2), Some(at(T0 + 2 * SEC)));
                // n 1 at 1.4 s: 2 * 0.6 + 3 + 1 = 5.2; fits when 2 (P - e) <= P: e = 0.5 s.
                assert_eq!(retry(&l, T0 + 1_400 * MS, 1), Some(at(T0 + 1_500 * MS)));
                // n 3 at 1.4 s: curr + n = 6 > 5: next window, 3 (P - e) + 3P <= 5P:
                // e >= P / 3, 333_333_333.3 -> 333_333_334 ns.
                assert_eq!(
                    retry(&l, T0 + 1_400 * MS, 3),
                    Some(at(T0 + 2 * SEC + 333_333_334))
                );
                // And it is exact: one nanosecond earlier the check is still denied.
                let probe = five();
                assert!(probe.allow_n_at(at(T0), 2));
                assert!(probe.allow_n_at(at(T0 + SEC), 3));
                assert!(!probe.allow_n_at(at(T0 + 2 * SEC + 333_333_333), 3));
                assert!(probe.allow_n_at(at(T0 + 2 * SEC + 333_333_334), 3));
            }

            #[test]
            fn status_says_what_allow_n_would_take_and_when_the_weight_is_gone() {
                let l = five();
                let st = |t: u64| l.status_at(at(t));
                let ws = |remaining, resets_at| WindowStatus { quota: 5, remaining, resets_at: at(resets_at) };
                assert_eq!(st(T0), ws(5, T0), "fresh: nothing weighs");
                assert!(l.allow_n_at(at(T0 + 100 * MS), 5));
                // curr 5 weighs until the end of the next window.
                assert_eq!(st(T0 + 100 * MS), ws(0, T0 + 2 * SEC));
                assert_eq!(st(T0 + SEC), ws(0, T0 + 2 * SEC));
                // 1.5 s: 2.5 weigh: floor(2.5) = 2 remain; only prev weighs, gone at 2 s.
                assert_eq!(st(T0 + 1_500 * MS), ws(2, T0 + 2 * SEC));
                assert_eq!(st(T0 + 1_600 * MS), ws(3, T0 + 2 * SEC));
                assert!(l.allow_at(at(T0 + 1_500 * MS)));
                // Window 1001 has a grant: it weighs until the end of window 1002.
                assert_eq!(st(T0 + 1_500 * MS), ws(1, T0 + 3 * SEC));
                assert_eq!(st(T0 + 2 * SEC), ws(4, T0 + 3 * SEC));
                assert_eq!(st(T0 + 3 * SEC), ws(5, T0 + 3 * SEC));
                assert_eq!(st(T0 + 7 * SEC + 5), ws(5, T0 + 7 * SEC + 5));
                // remaining is exactly the largest n that allow_n_at grants.
                let t = T0 + 1_700 * MS; // 5 * 0.3 + 1 = 2.5: 2 remain
                assert_eq!(st(t).remaining, 2);
                assert!(!l.allow_n_at(at(t), 3));
                assert!(l.allow_n_at(at(t), 2));
                assert_eq!(st(t).remaining, 0);
            }

            #[test]
            fn a_stale_time_is_judged_at_the_start_of_the_state_window() {
                let l = five();
                assert!(l.allow_n_at(at(T0), 3));
                // 1.5 s: 3 * 0.5 + 2 = 3.5.
                assert!(l.allow_n_at(at(T0 + 1_500 * MS), 2));
                // A reading from window 1000 is judged at 1.0 s: 3 + 2 + 1 > 5. Rolled back
                // into window 1000 it would see 3 + 1 <= 5: an earlier time never frees
                // capacity.
                let d = l.check_n_at(at(T0 + 500 * MS), 1).unwrap_err();
                // Retry in window 1001: 3 (P - e) + 3P <= 5P: e >= P / 3 -> 333_333_334.
                assert_eq!(d.retry_at(), Some(at(T0 + SEC + 333_333_334)));
                assert_eq!(d.checked_at(), at(T0 + 500 * MS));
                let st = l.status_at(at(T0 + 500 * MS));
                assert_eq!((st.remaining, st.resets_at), (0, at(T0 + 3 * SEC)));
                assert!(!l.is_idle_at(at(0)));
            }

            #[test]
            fn a_stale_grant_is_counted_in_the_later_window() {
                let l = sw(10, Duration::from_secs(1));
                assert!(l.allow_n_at(at(T0), 2));
                assert!(l.allow_at(at(T0 + 1_500 * MS)));
                // A reading from window 1000: judged at 1.0 s (2 + 1 + 1 <= 10), counted in
                // window 1001.
                assert!(l.allow_at(at(T0 + 500 * MS)));
                // At 2.0 s window 1001's 2 weigh fully: 8 remain (9 if it had gone to 1000).
                assert_eq!(l.status_at(at(T0 + 2 * SEC)).remaining, 8);
            }

            #[test]
            fn zero_permits_are_always_granted_and_change_nothing() {
                let l = five();
                assert!(l.allow_n_at(at(T0), 0));
                assert!(l.is_idle_at(at(T0)));
                assert!(l.allow_n_at(at(T0), 5));
                assert!(l.allow_n_at(at(T0), 0));
                assert!(l.check_n_at(at(T0), 0).is_ok());
                // n = 0 at a later time does not roll the state either: a stale check at
                // window 1000 is still judged in window 1000.
                assert!(l.allow_n_at(at(T0 + 5 * SEC), 0));
                assert_eq!(l.status_at(at(T0 + 500 * MS)).remaining, 0);
                assert!(!l.allow_at(at(T0 + 500 * MS)));
            }

            #[test]
            fn more_than_the_quota_is_never_granted_and_changes_nothing() {
                let l = five();
                assert!(!l.allow_n_at(at(T0), 6));
                assert_eq!(retry(&l, T0, 6), None);
                assert_eq!(retry(&l, T0, u32::MAX), None);
                assert!(l.is_idle_at(at(T0)));
                assert!(l.allow_n_at(at(T0), 5));
            }

            #[test]
            fn idle_when_nothing_weighs_and_then_like_a_fresh_limiter() {
                let l = five();
                assert!(l.is_idle_at(at(0)));
                assert!(l.allow_n_at(at(T0 + 700 * MS), 2));
                assert!(!l.is_idle_at(at(T0 + 700 * MS)));
                assert!(!l.is_idle_at(at(T0 + 2 * SEC - 1)), "weighs 2 * 1 / P");
                assert!(l.is_idle_at(at(T0 + 2 * SEC)));
                // Only prev weighs: idle at the end of its successor.
                let l = five();
                assert!(l.allow_at(at(T0)));
                assert!(l.allow_at(at(T0 + SEC + 300 * MS)));
                assert!(!l.is_idle_at(at(T0 + 3 * SEC - 1)));
                assert!(l.is_idle_at(at(T0 + 3 * SEC)));
                // From an idle time on it decides like a fresh limiter.
                let fresh = five();
                for (dt, n) in [(0, 3), (0, 3), (400, 2), (1_100, 5), (1_500, 2), (2_250, 4)] {
                    let t = at(T0 + 3 * SEC + dt * MS);
                    assert_eq!(l.check_n_at(t, n), fresh.check_n_at(t, n), "{dt} ms, {n}");
                    assert_eq!(l.status_at(t), fresh.status_at(t));
                }
            }

            #[test]
            fn plain_forms_read_the_clock() {
                let l = five();
                let clock = l.clock().clone();
                assert!(l.allow_n(4));
                assert!(l.allow());
                assert!(!l.allow());
                assert_eq!(l.status().resets_at, at(T0 + 2 * SEC));
                assert_eq!(l.clock().now(), at(T0));
                clock.set(at(T0 + 1_500 * MS));
                assert_eq!(l.status().remaining, 2);
                assert!(l.check_n(2).is_ok());
                // 2.5 + 2 = 4.5; one more fits when 5 (P - e) + 3P <= 5P: e = 0.6 s.
                assert_eq!(l.check().unwrap_err().retry_at(), Some(at(T0 + 1_600 * MS)));
            }
        }
    };
}
