//! The SVG: requests/s and CPU µs per request, one small bar chart per load, bars by mode.

use std::path::Path;

use plotters::prelude::*;

use crate::datapath::{DataPath, Mode};
use crate::report::per_round;
use crate::stats::median;
use crate::wrk::LOADS;

/// One colour per mode, in `Mode::ALL` order.
const COLORS: [RGBColor; Mode::ALL.len()] = [
    RGBColor(150, 150, 150),
    RGBColor(90, 90, 90),
    RGBColor(214, 96, 77),
    RGBColor(67, 147, 195),
    RGBColor(33, 102, 172),
    RGBColor(146, 197, 222),
    RGBColor(140, 110, 190),
    RGBColor(230, 160, 40),
    RGBColor(120, 180, 120),
    RGBColor(190, 120, 90),
    RGBColor(40, 150, 150),
];

pub fn draw(dp: &DataPath, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (1400, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let (legend, charts) = root.split_vertically(40);
    for (i, mode) in Mode::ALL.iter().enumerate() {
        let x = 20 + i as i32 * 152;
        legend.draw(&Rectangle::new([(x, 12), (x + 16, 28)], COLORS[i].filled()))?;
        legend.draw(&Text::new(mode.name(), (x + 22, 14), ("sans-serif", 13)))?;
    }
    let panels = charts.split_evenly((2, LOADS.len()));
    type Metric = fn(&crate::datapath::Sample) -> f64;
    let metrics: [(&str, Metric); 2] = [
        ("req/s", |s| s.wrk.rps),
        ("CPU µs/req", |s| s.cpu_us_per_req),
    ];
    for (row, (label, f)) in metrics.iter().enumerate() {
        for (col, load) in LOADS.iter().enumerate() {
            let values: Vec<f64> = Mode::ALL
                .iter()
                .map(|m| median(&per_round(dp, *m, load.name, f)))
                .map(|v| if v.is_finite() { v } else { 0.0 })
                .collect();
            let top = values.iter().cloned().fold(0.0, f64::max).max(1e-9) * 1.15;
            let mut chart = ChartBuilder::on(&panels[row * LOADS.len() + col])
                .caption(format!("{} — {label}", load.name), ("sans-serif", 16))
                .margin(8)
                .x_label_area_size(10)
                .y_label_area_size(60)
                .build_cartesian_2d(0f64..Mode::ALL.len() as f64, 0f64..top)?;
            chart
                .configure_mesh()
                .disable_x_mesh()
                .disable_x_axis()
                .y_labels(5)
                .draw()?;
            chart.draw_series(values.iter().enumerate().map(|(i, v)| {
                let x = i as f64;
                Rectangle::new([(x + 0.1, 0.0), (x + 0.9, *v)], COLORS[i].filled())
            }))?;
        }
    }
    root.present()?;
    Ok(())
}
