//! How often the sketch refuses a client it should not, and the size that keeps that rare.
//!
//! # The model
//! `A` **abusers** check far above the limit, so each keeps its `d` cells at the top of the
//! burst (`x >= u + tau - one`: the next token is refused to anyone who reads it there).
//! Everyone else is well under the limit and leaves cells low. An **innocent** client is
//! refused only if all `d` of its cells are held by abusers. Keys hash uniformly and
//! independently to one of the `W = 4 L` words of `L` lines and to one of the `C(4, d)` sets
//! of `d` of its four cells.
//!
//! For a fixed set `D` of `j` cells in the innocent's word, one abuser misses all of `D`
//! with probability `(1 - 1/W) + (1/W) * q_j`, where `q_j = C(4 - j, d) / C(4, d)` is the
//! chance that a set of `d` cells in the same word avoids `D`. Abusers are independent, so
//! all miss `D` with probability `p_j = (1 - (1 - q_j) / W)^A`, and by inclusion-exclusion
//! over which of the innocent's `d` cells stay free,
//!
//! ```text
//! P(refused) = sum_{j = 0..=d} (-1)^j C(d, j) p_j
//! ```
//!
//! For `A / W` small this is about `(A / W) / C(4, d)`: the chance that one abuser landed in
//! the innocent's word *and* drew the same cells, which alone covers it. So doubling the
//! memory halves it, and `d = 2` (six pairs per word) makes it rarest. That is the price of
//! one word per key (one cache line, one CAS): cells spread over independent words would make
//! the rate quadratic in `A / W`, at the cost of a write per cell and of the all-or-nothing
//! update. `tests/keyed/sketch_sim.rs` checks the formula against a simulation of
//! Zipf-distributed clients with 1 % abusers.

/// Cells per word and words per line, as in `cells.rs`.
const CELLS: u64 = super::cells::CELLS as u64;
const WORDS: f64 = super::cells::WORDS as f64;

/// `C(n, k)` for the small numbers here.
fn choose(n: u64, k: u64) -> f64 {
    if k > n {
        return 0.0;
    }
    (0..k).fold(1.0, |acc, i| acc * (n - i) as f64 / (i + 1) as f64)
}

/// The probability that an innocent client's `d` cells are all held by `abusers` abusers in a
/// table of `lines` lines (the module docs' formula).
pub(crate) fn false_refusal_rate(lines: usize, d: usize, abusers: u64) -> f64 {
    let (w, d64, a) = (lines as f64 * WORDS, d as u64, abusers as f64);
    let all = choose(CELLS, d64);
    let mut p = 0.0;
    for j in 0..=d64 {
        let q = choose(CELLS - j, d64) / all;
        // (1 - (1 - q) / W)^A, through ln_1p for accuracy when (1 - q) / W is tiny.
        let miss = (a * (-(1.0 - q) / w).ln_1p()).exp();
        let sign = if j % 2 == 0 { 1.0 } else { -1.0 };
        p += sign * choose(d64, j) * miss;
    }
    p.clamp(0.0, 1.0)
}

/// The fewest lines, a power of two up to `max_lines`, that keep the false-refusal rate
/// with `abusers` at or below `rate`; `None` if even `max_lines` do not.
pub(crate) fn lines_for(abusers: u64, d: usize, rate: f64, max_lines: usize) -> Option<usize> {
    let mut lines = 1usize;
    loop {
        if false_refusal_rate(lines, d, abusers) <= rate {
            return Some(lines);
        }
        if lines >= max_lines {
            return None;
        }
        lines *= 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With one cell per key the formula is the plain collision probability: a cell is held
    /// unless every abuser avoids it.
    #[test]
    fn one_cell_is_one_minus_every_abuser_missing() {
        let (lines, a) = (1024usize, 500u64);
        let direct = 1.0 - (1.0 - 1.0 / (lines as f64 * 16.0)).powf(a as f64);
        let p = false_refusal_rate(lines, 1, a);
        assert!((p - direct).abs() < 1e-12, "{p} vs {direct}");
    }

    /// No abusers, no false refusals; fewer with more memory; fewest with two cells a key.
    #[test]
    fn the_rate_falls_with_memory_and_is_lowest_with_two_cells() {
        assert_eq!(false_refusal_rate(1024, 2, 0), 0.0);
        let mut last = 1.0;
        for lines in [64, 256, 1024, 4096] {
            let p = false_refusal_rate(lines, 2, 1000);
            assert!(p < last, "{lines}: {p} >= {last}");
            last = p;
        }
        let (p1, p2, p3) = (
            false_refusal_rate(4096, 1, 1000),
            false_refusal_rate(4096, 2, 1000),
            false_refusal_rate(4096, 3, 1000),
        );
        assert!(p2 < p1 && p2 < p3, "{p1} {p2} {p3}");
    }

    /// A count over every placement of an innocent and two abusers in one line (four words
    /// of four cells) agrees with the formula, for each `d`.
    #[test]
    fn the_formula_matches_enumeration_in_one_line() {
        for d in 1..=3u32 {
            let places: Vec<(u8, u8)> = (0..4u8)
                .flat_map(|w| {
                    (0u8..16)
                        .filter(move |s| s.count_ones() == d)
                        .map(move |s| (w, s))
                })
                .collect();
            let (mut held, mut total) = (0usize, 0usize);
            for &(wi, si) in &places {
                for &(wa, sa) in &places {
                    for &(wb, sb) in &places {
                        total += 1;
                        let cover = if wa == wi { sa } else { 0 } | if wb == wi { sb } else { 0 };
                        if si & !cover == 0 {
                            held += 1;
                        }
                    }
                }
            }
            let exact = held as f64 / total as f64;
            let p = false_refusal_rate(1, d as usize, 2);
            assert!((p - exact).abs() < 1e-12, "d {d}: {p} vs {exact}");
        }
    }

    #[test]
    fn lines_for_finds_the_smallest_power_of_two() {
        let lines = lines_for(1000, 2, 1e-3, 1 << 30).unwrap();
        assert!(false_refusal_rate(lines, 2, 1000) <= 1e-3);
        assert!(false_refusal_rate(lines / 2, 2, 1000) > 1e-3);
        assert_eq!(lines_for(1000, 2, 1e-30, 1 << 10), None);
    }
}
