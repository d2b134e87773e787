//! PNG charts (plotters, bitmap backend): the fonts they need, and the line chart of shortlist coverage.
//! The benchmark's bar chart lives with its report (`bench::report::draw_chart`).

use std::path::{Path, PathBuf};

/// TrueType fonts tried for the chart's text, in order (`KOLM_RSD_FONT` first). Debian: `fonts-dejavu-core`.
pub const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
];

pub fn register_font() -> Result<(), String> {
    use std::sync::OnceLock;
    static FONT: OnceLock<Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let candidates: Vec<PathBuf> = std::env::var_os("KOLM_RSD_FONT").map(PathBuf::from).into_iter().chain(FONT_PATHS.iter().map(PathBuf::from)).collect();
        for p in &candidates {
            if let Ok(bytes) = std::fs::read(p) {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", plotters::style::FontStyle::Normal, bytes).is_ok() {
                    return Ok(());
                }
            }
        }
        Err(format!(
            "no TrueType font for the chart's text (tried {}; on Debian: apt-get install fonts-dejavu-core, or set KOLM_RSD_FONT)",
            candidates.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        ))
    })
    .clone()
}

/// Draws lines (label, points (x, y in 0..=1)) on one chart to a PNG: y as a percentage.
pub fn draw_lines(path: &Path, title: &str, x_desc: &str, y_desc: &str, lines: &[(String, Vec<(f64, f64)>)]) -> Result<(), String> {
    use plotters::prelude::*;
    register_font()?;
    let xmax = lines.iter().flat_map(|(_, p)| p.iter().map(|q| q.0)).fold(1.0f64, f64::max);
    let root = BitMapBackend::new(path, (900, 520)).into_drawing_area();
    let e = |e: DrawingAreaErrorKind<_>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..xmax * 1.02, 0f64..100f64)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&|x| format!("{}K", (x / 1000.0).round()))
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(e)?;
    let colours = [RGBColor(31, 119, 180), RGBColor(255, 127, 14), RGBColor(44, 160, 44), RGBColor(214, 39, 40), RGBColor(148, 103, 189)];
    for (i, (label, pts)) in lines.iter().enumerate() {
        let c = colours[i % colours.len()];
        let data: Vec<(f64, f64)> = pts.iter().map(|&(x, y)| (x, 100.0 * y)).collect();
        chart
            .draw_series(LineSeries::new(data.clone(), c.stroke_width(2)))
            .map_err(e)?
            .label(label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
        chart.draw_series(data.iter().map(|&p| Circle::new(p, 3, c.filled()))).map_err(e)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}
