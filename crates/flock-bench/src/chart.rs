//! The SVG chart: contended grant rate and hand-off p99 against clients,
//! one line per method, one row of panels per hold time.

use std::error::Error;
use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::results::{Metric, Sample};
use crate::scenarios::contended;

pub fn draw(rows: &[Sample], path: &Path) -> Result<(), Box<dyn Error>> {
    let mut scenarios: Vec<&str> =
        rows.iter().map(|r| r.scenario.as_str()).filter(|s| s.starts_with("contended")).collect();
    scenarios.dedup();
    if scenarios.is_empty() {
        return Ok(());
    }
    let root = SVGBackend::new(path, (1100, 380 * scenarios.len() as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((scenarios.len(), 2));
    for (row, scenario) in scenarios.iter().enumerate() {
        let of: Vec<&Sample> = rows.iter().filter(|r| r.scenario == *scenario).collect();
        panel(&panels[2 * row], &format!("{scenario}: grants/s"), &of, contended::GRANTS)?;
        panel(&panels[2 * row + 1], &format!("{scenario}: hand-off p99 (µs)"), &of, contended::GAP_P99)?;
    }
    root.present()?;
    Ok(())
}

/// `metric` (log scale) against the client counts, evenly spaced, one line
/// per method.
fn panel(
    area: &DrawingArea<SVGBackend, Shift>,
    title: &str,
    rows: &[&Sample],
    metric: Metric,
) -> Result<(), Box<dyn Error>> {
    let mut clients: Vec<usize> = rows.iter().map(|r| r.clients).collect();
    clients.sort_unstable();
    clients.dedup();
    let mut methods: Vec<&str> = Vec::new();
    for row in rows {
        if !methods.contains(&row.method) {
            methods.push(row.method);
        }
    }
    let series: Vec<(&str, Vec<(f64, f64)>)> = methods
        .iter()
        .map(|&m| {
            let points = rows
                .iter()
                .filter(|r| r.method == m)
                .filter_map(|r| Some((clients.iter().position(|&c| c == r.clients)? as f64, r.get(metric)?)))
                .filter(|&(_, v)| v.is_finite() && v > 0.0)
                .collect();
            (m, points)
        })
        .collect();
    let values = series.iter().flat_map(|(_, p)| p.iter().map(|&(_, v)| v));
    let (low, high) = values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if low > high {
        return Ok(());
    }
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(-0.3..clients.len() as f64 - 0.7, (low / 2.0..high * 2.0).log_scale())?;
    let client_label = |x: &f64| {
        let i = x.round();
        if (x - i).abs() < 1e-6 {
            clients.get(i as usize).map_or(String::new(), usize::to_string)
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .x_labels(clients.len())
        .x_label_formatter(&client_label)
        .x_max_light_lines(0)
        .y_label_formatter(&|v| format!("{v:.0}"))
        .x_desc("clients")
        .draw()?;
    for (i, (method, points)) in series.into_iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(method)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
        chart.draw_series(points.into_iter().map(|p| Circle::new(p, 3, color.filled())))?;
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
    Ok(())
}
