//! `bench --plot FILE.png`: tok/s against depth, one line per test (the `-d` list gives the
//! points), and for runs with host experts a second panel with the card's share of the routed
//! calls over the run (each repetition's calls). Drawn with plotters' bitmap backend; the text
//! uses DejaVu Sans embedded from the `dejavu` crate, so no system font is needed.

use std::path::Path;

use anyhow::anyhow;
use plotters::prelude::*;

use super::report::{mean_sd, Record};

/// The lines' colours (distinct on white, none pale).
const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(140, 86, 75),
];

/// What the run measured, gathered for the chart.
#[derive(Default)]
pub struct Plot {
    /// Each test's name (its depth left out), depth and mean tok/s, in run order.
    rates: Vec<(String, u32, f64)>,
    /// After each repetition of a run with host experts: seconds since the run started and the
    /// routed calls so far on the card and on the host.
    routed: Vec<(f64, u64, u64)>,
}

impl Plot {
    /// Adds a test's mean rate.
    pub fn rate(&mut self, r: &Record) {
        let name = Record {
            n_depth: 0,
            ..r.clone()
        }
        .test_name();
        let (mean, _) = mean_sd(&r.samples_ts());
        self.rates.push((name, r.n_depth, mean));
    }

    /// Adds a sample of the routed-call counters (cumulative since the model was loaded: a new
    /// load starts from zero again).
    pub fn routed(&mut self, secs: f64, card: u64, host: u64) {
        self.routed.push((secs, card, host));
    }

    /// The card's share (percent) of the routed calls between consecutive samples, at each
    /// sample's time.
    fn shares(&self) -> Vec<(f64, f64)> {
        let mut out = Vec::new();
        let mut last = (0u64, 0u64);
        for &(t, card, host) in &self.routed {
            // Counters that went down belong to a new load.
            if card < last.0 || host < last.1 {
                last = (0, 0);
            }
            let (dc, dh) = (card - last.0, host - last.1);
            if dc + dh > 0 {
                out.push((t, 100.0 * dc as f64 / (dc + dh) as f64));
            }
            last = (card, host);
        }
        out
    }

    /// Each test's points (depth, tok/s), tests in first-seen order.
    fn series(&self) -> Vec<(String, Vec<(f64, f64)>)> {
        let mut out: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
        for (name, depth, rate) in &self.rates {
            let point = (f64::from(*depth), *rate);
            match out.iter_mut().find(|(n, _)| n == name) {
                Some((_, pts)) => pts.push(point),
                None => out.push((name.clone(), vec![point])),
            }
        }
        out
    }

    /// Draws the chart into `path` (PNG) under `title`.
    pub fn draw(&self, path: &Path, title: &str) -> anyhow::Result<()> {
        plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
            .map_err(|_| anyhow!("the embedded font could not be read"))?;
        let shares = self.shares();
        let height = if shares.is_empty() { 540 } else { 960 };
        let root = BitMapBackend::new(path, (960, height)).into_drawing_area();
        root.fill(&WHITE)?;
        let panels = if shares.is_empty() {
            vec![root.clone()]
        } else {
            root.split_evenly((2, 1))
        };
        let series = self.series();
        let max_depth = series
            .iter()
            .flat_map(|(_, p)| p.iter().map(|q| q.0))
            .fold(0.0, f64::max);
        let max_rate = series
            .iter()
            .flat_map(|(_, p)| p.iter().map(|q| q.1))
            .fold(0.0, f64::max);
        let mut chart = ChartBuilder::on(&panels[0])
            .caption(format!("{title}: tok/s against depth"), ("sans-serif", 22))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(72)
            .build_cartesian_2d(
                0.0..(max_depth * 1.05).max(1.0),
                0.0..(max_rate * 1.15).max(1.0),
            )?;
        chart
            .configure_mesh()
            .x_desc("depth (tokens already in the context)")
            .y_desc("tokens per second")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .label_style(("sans-serif", 14))
            .draw()?;
        for (i, (name, points)) in series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
                .label(name.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font(("sans-serif", 14))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
        if let Some(panel) = panels.get(1) {
            let end = shares.iter().map(|s| s.0).fold(0.0, f64::max);
            let mut chart = ChartBuilder::on(panel)
                .caption(
                    "the card's share of routed calls (layers with host experts)",
                    ("sans-serif", 22),
                )
                .margin(16)
                .x_label_area_size(44)
                .y_label_area_size(72)
                .build_cartesian_2d(0.0..(end * 1.05).max(1.0), 0.0..100.0)?;
            chart
                .configure_mesh()
                .x_desc("seconds into the run")
                .y_desc("% of routed calls on the card")
                .y_label_formatter(&|y| format!("{y:.0}"))
                .label_style(("sans-serif", 14))
                .draw()?;
            chart.draw_series(LineSeries::new(shares.clone(), BLUE.stroke_width(2)))?;
            chart.draw_series(shares.iter().map(|&p| Circle::new(p, 3, BLUE.filled())))?;
        }
        root.present()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(n_gen: u32, depth: u32, ns: u64) -> Record {
        Record {
            n_gen,
            n_depth: depth,
            n_seq: 1,
            samples_ns: vec![ns],
            samples_tokens: vec![u64::from(n_gen)],
            ..Record::default()
        }
    }

    #[test]
    fn rates_group_by_test_and_shares_restart_with_each_load() {
        let mut p = Plot::default();
        p.rate(&record(16, 0, 1_000_000_000));
        p.rate(&record(16, 512, 2_000_000_000));
        p.rate(&record(32, 0, 1_000_000_000));
        let s = p.series();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].0, "tg16");
        assert_eq!(s[0].1, vec![(0.0, 16.0), (512.0, 8.0)]);
        p.routed(1.0, 30, 70);
        p.routed(2.0, 80, 70);
        p.routed(3.0, 5, 5);
        assert_eq!(p.shares(), vec![(1.0, 30.0), (2.0, 100.0), (3.0, 50.0)]);
    }

    #[test]
    fn a_chart_is_written_as_png() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plot.png");
        let mut p = Plot::default();
        p.rate(&record(16, 0, 1_000_000_000));
        p.rate(&record(16, 512, 2_000_000_000));
        p.routed(1.0, 30, 70);
        p.draw(&path, "qwen3moe ?B all F32").unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    }
}
