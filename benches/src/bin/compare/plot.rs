//! The sweep as a PNG (`plotters`): one column per dimension, deliveries/s above and p99
//! publish → ACK below, the x axis logarithmic. Text is drawn with a TrueType font of the
//! system (DejaVu or Liberation Sans, as Debian's fonts-dejavu-core and fonts-liberation
//! install them); without one there is no plot, and the sweep says so.

use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

use super::sweep::{Point, DIMENSIONS};
use super::Machine;

const FONTS: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/liberation2/LiberationSans-Regular.ttf",
];

type Failure = Box<dyn std::error::Error>;

fn font() -> Result<(), Failure> {
    let bytes = FONTS
        .iter()
        .find_map(|p| std::fs::read(p).ok())
        .ok_or_else(|| format!("no TrueType font at {}", FONTS.join(" or ")))?;
    // Registered once for the process; plotters keeps a `'static` slice.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| "the font is not TrueType plotters can read")?;
    Ok(())
}

pub fn draw(path: &str, points: &[Point], machine: &Machine) -> Result<(), Failure> {
    font()?;
    let dims: Vec<&str> = DIMENSIONS
        .iter()
        .map(|(d, _)| *d)
        .filter(|d| points.iter().any(|p| p.dimension == *d))
        .collect();
    if dims.is_empty() {
        return Err("no points to plot".into());
    }
    let root = BitMapBackend::new(path, (360 * dims.len() as u32, 720)).into_drawing_area();
    root.fill(&WHITE)?;
    let (head, body) = root.split_vertically(50);
    head.draw(&Text::new(
        format!(
            "unimesh scaling (embedded log, sync=always, long-poll; one dimension grows, the rest fixed) — {} cores, {}, load {:.1}",
            machine.cores, machine.model, machine.load1
        ),
        (10, 15),
        ("sans-serif", 18).into_font(),
    ))?;
    let cells = body.split_evenly((2, dims.len()));
    for (col, dim) in dims.iter().enumerate() {
        let mine: Vec<&Point> = points.iter().filter(|p| p.dimension == *dim).collect();
        let x_max = mine.iter().map(|p| p.value).max().unwrap_or(1) as f64;
        let x_min = mine.iter().map(|p| p.value).min().unwrap_or(1) as f64;
        let x_range = (x_min * 0.8)..(x_max * 1.25);
        let unit = match *dim {
            "size" => "event size, bytes",
            "in-flight" => "maxInFlightPerClient",
            "groups" => "groups on one topic",
            other => other,
        };
        for (row, (what, value)) in [
            (
                "deliveries/s",
                (|p: &Point| p.deliveries_per_s) as fn(&Point) -> f64,
            ),
            ("p99 publish→ACK, ms", |p: &Point| p.ack_p99_ms),
        ]
        .into_iter()
        .enumerate()
        {
            let area = &cells[row * dims.len() + col];
            let y_max = mine.iter().map(|p| value(p)).fold(0.0, f64::max) * 1.15;
            let mut chart = ChartBuilder::on(area)
                .caption(format!("{what} by {dim}"), ("sans-serif", 16))
                .margin(10)
                .x_label_area_size(40)
                .y_label_area_size(60)
                .build_cartesian_2d(x_range.clone().log_scale(), 0f64..y_max.max(1.0))?;
            chart
                .configure_mesh()
                .x_desc(unit)
                .label_style(("sans-serif", 12))
                .x_label_formatter(&|x| format!("{x:.0}"))
                .y_label_formatter(&|y| format!("{y:.0}"))
                .draw()?;
            let series: Vec<(f64, f64)> = mine.iter().map(|p| (p.value as f64, value(p))).collect();
            let color = if row == 0 { BLUE } else { RED };
            chart.draw_series(LineSeries::new(series.clone(), color.stroke_width(2)))?;
            chart.draw_series(series.iter().map(|&xy| Circle::new(xy, 4, color.filled())))?;
        }
    }
    root.present()?;
    Ok(())
}
