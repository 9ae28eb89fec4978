//! `--plot FILE.svg`: ops/s against threads, one panel per limiter, one line per
//! implementation. Built only with the `plot` feature (plotters, SVG backend only).

use std::path::Path;

use plotters::prelude::*;

use super::harness::{Impl, Report};

fn color(imp: Impl) -> RGBColor {
    match imp {
        Impl::Turnstile => RGBColor(31, 119, 180),
        Impl::TurnstileInline => RGBColor(23, 190, 207),
        Impl::MutexTwin => RGBColor(214, 39, 40),
        Impl::Governor => RGBColor(44, 160, 44),
        Impl::Floor => RGBColor(127, 127, 127),
        Impl::FloorCas => RGBColor(188, 189, 34),
        Impl::FloorIndirect => RGBColor(148, 103, 189),
    }
}

/// Draws `report` to the SVG file `path`.
pub fn plot(path: &Path, report: &Report, title: &str) -> Result<(), String> {
    draw(path, report, title).map_err(|e| format!("{}: {e}", path.display()))
}

fn draw(
    path: &Path,
    report: &Report,
    title: &str,
) -> Result<(), Box<dyn std::error::Error + 'static>> {
    let limiters = report.limiters();
    let cols = 2usize;
    let rows = limiters.len().div_ceil(cols).max(1);
    let (width, height) = (1100u32, 50 + 300 * rows as u32);
    let root = SVGBackend::new(path, (width, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 22))?;
    let panels = root.split_evenly((rows, cols));

    let mut threads: Vec<usize> = report.cells.iter().map(|c| c.threads).collect();
    threads.sort_unstable();
    threads.dedup();
    // One evenly spaced slot per thread count run (they are usually powers of two), labelled
    // with the count: no axis ticks at thread counts that did not run.
    // A single thread count sits in the middle slot of three, so the axis is never empty.
    let (last_slot, offset) = match threads.len() as u32 {
        0 | 1 => (2, 1),
        n => (n - 1, 0),
    };
    let slot_of = |t: usize| offset + threads.iter().position(|&x| x == t).unwrap_or(0) as u32;

    for (panel, limiter) in panels.iter().zip(&limiters) {
        let cells: Vec<_> = report
            .cells
            .iter()
            .filter(|c| c.limiter == *limiter)
            .collect();
        let top = cells
            .iter()
            .map(|c| c.ops_per_sec() / 1e6)
            .fold(0.0f64, f64::max)
            .max(1e-3)
            // Headroom for the legend in the upper left.
            * 1.5;
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!("{limiter} (phase {})", cells[0].phase),
                ("sans-serif", 18),
            )
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(55)
            .build_cartesian_2d((0u32..last_slot).into_segmented(), 0f64..top)?;
        chart
            .configure_mesh()
            .x_desc("threads")
            .y_desc("Mops/s")
            .x_labels(threads.len() + 1)
            .x_label_formatter(&|x| match x {
                SegmentValue::CenterOf(i) => threads
                    .get(i.wrapping_sub(offset) as usize)
                    .map_or(String::new(), |t| t.to_string()),
                _ => String::new(),
            })
            .light_line_style(WHITE.mix(0.0))
            .y_label_formatter(&|y| format!("{y:.1}"))
            .draw()?;
        for imp in Impl::ALL {
            let points: Vec<(SegmentValue<u32>, f64)> = threads
                .iter()
                .filter_map(|&t| {
                    // With --runs, the median run.
                    let mut runs: Vec<f64> = cells
                        .iter()
                        .filter(|c| c.implementation == imp && c.threads == t)
                        .map(|c| c.ops_per_sec() / 1e6)
                        .collect();
                    runs.sort_by(f64::total_cmp);
                    let mid = *runs.get(runs.len() / 2)?;
                    Some((SegmentValue::CenterOf(slot_of(t)), mid))
                })
                .collect();
            if points.is_empty() {
                continue;
            }
            let col = color(imp);
            chart
                .draw_series(LineSeries::new(points.clone(), col.stroke_width(2)))?
                .label(imp.name())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], col.stroke_width(2))
                });
            chart.draw_series(points.into_iter().map(|p| Circle::new(p, 4, col.filled())))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .label_font(("sans-serif", 13))
            .draw()?;
    }
    root.present()?;
    Ok(())
}
