//! The soak's curves as a PNG: resident memory, open files, threads and packet buffers of
//! every daemon over the run, with the cloud's and adapter B's restarts drawn as vertical
//! lines and the periods of underlay loss shaded. Read back from what a run writes
//! (`samples.csv`, `report.json`), so a run that failed, or one made before this code, can
//! be drawn too (`cyphonic-bed soak-plot`).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context as _, anyhow};
use plotters::prelude::*;
use plotters::style::FontStyle;

use super::{
    ADAPTER_RESTARTED, CLOUD_RESTARTED, DAEMONS, Figures, LOSS_OFF, LOSS_ON, Sample, read_samples,
};

/// Where the plot's font is looked for (Debian's `fonts-dejavu-core`).
const FONTS: [&str; 2] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

/// One colour and line width per daemon, in [`DAEMONS`]' order: the first ones wider, so
/// that equal figures (the two adapters' files and threads) show as a line with a border.
const LINES: [(RGBColor, u32); 4] = [
    (RGBColor(31, 119, 180), 6),
    (RGBColor(255, 127, 14), 3),
    (RGBColor(44, 160, 44), 2),
    (RGBColor(148, 103, 189), 2),
];

/// The panels: a title and how a sample gives its value.
type Panel = (&'static str, fn(&Figures) -> f64);

#[expect(
    clippy::cast_precision_loss,
    reason = "figures of a process: far below 2^52"
)]
const PANELS: [Panel; 4] = [
    ("Resident memory, MiB", |f| f.rss_kib as f64 / 1024.0),
    ("Open files", |f| f.fds as f64),
    ("Threads", |f| f.threads as f64),
    ("Packet buffers allocated", |f| f.buffers as f64),
];

/// What the curves are drawn over: restarts and the periods of loss, in seconds.
#[derive(Debug, Default, PartialEq)]
pub struct Marks {
    /// The cloud restarted.
    pub cloud: Vec<u64>,
    /// Adapter B restarted.
    pub adapter: Vec<u64>,
    /// Loss on the underlay, from .. to (the end of the run if it was still on).
    pub loss: Vec<(u64, u64)>,
}

impl Marks {
    /// From a run's events (`report.json`'s `events`), the run lasting `end` seconds.
    pub fn from_events(events: &[(u64, String)], end: u64) -> Self {
        let mut marks = Self::default();
        let mut lossy_since = None;
        for (at, what) in events {
            match what.as_str() {
                CLOUD_RESTARTED => marks.cloud.push(*at),
                ADAPTER_RESTARTED => marks.adapter.push(*at),
                LOSS_ON => lossy_since = Some(*at),
                LOSS_OFF => {
                    if let Some(from) = lossy_since.take() {
                        marks.loss.push((from, *at));
                    }
                }
                _ => {}
            }
        }
        if let Some(from) = lossy_since {
            marks.loss.push((from, end));
        }
        marks
    }
}

/// Draws `dir`'s `samples.csv` and `report.json` into `dir/soak.png`; returns its path.
///
/// # Errors
/// The files cannot be read, no font is installed, or drawing fails.
pub fn render_dir(dir: &Path) -> anyhow::Result<PathBuf> {
    let csv = std::fs::read_to_string(dir.join("samples.csv"))
        .with_context(|| format!("reading {}/samples.csv", dir.display()))?;
    let samples = read_samples(&csv)?;
    #[derive(serde::Deserialize)]
    struct Events {
        cycles: u64,
        events: Vec<(u64, String)>,
    }
    let report: Events = serde_json::from_slice(
        &std::fs::read(dir.join("report.json"))
            .with_context(|| format!("reading {}/report.json", dir.display()))?,
    )
    .context("report.json")?;
    let end = samples.iter().map(|s| s.at).max().unwrap_or(0);
    let marks = Marks::from_events(&report.events, end);
    let path = dir.join("soak.png");
    render(&samples, &marks, report.cycles, &path)?;
    Ok(path)
}

/// Draws the four panels of `samples` over `marks` into the PNG at `path`.
///
/// # Errors
/// No font is installed, or drawing or writing fails.
pub fn render(samples: &[Sample], marks: &Marks, cycles: u64, path: &Path) -> anyhow::Result<()> {
    font()?;
    let err = |e: DrawingAreaErrorKind<_>| anyhow!("drawing {}: {e:?}", path.display());
    let root = BitMapBackend::new(path, (1600, 1000)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let end = samples.iter().map(|s| s.at).max().unwrap_or(0);
    #[expect(
        clippy::cast_precision_loss,
        reason = "seconds of a run: far below 2^52"
    )]
    let minutes = |s: u64| s as f64 / 60.0;
    let title = format!(
        "cyphonic soak: {cycles} cycles in {:.0} min; cloud restarted {}x (red), adapter B {}x (black); underlay loss shaded",
        minutes(end),
        marks.cloud.len(),
        marks.adapter.len()
    );
    let body = root
        .titled(&title, ("sans-serif", 26))
        .map_err(|e| anyhow!("drawing the title: {e:?}"))?;
    let x_end = minutes(end).max(1.0);
    for (area, (caption, value)) in body.split_evenly((2, 2)).iter().zip(PANELS) {
        let top = samples
            .iter()
            .map(|s| value(&s.figures))
            .fold(1.0, f64::max)
            * 1.15;
        let mut chart = ChartBuilder::on(area)
            .caption(caption, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..x_end, 0.0..top)
            .map_err(|e| anyhow!("drawing {caption}: {e:?}"))?;
        chart
            .configure_mesh()
            .x_desc("minutes into the run")
            .light_line_style(WHITE)
            .draw()
            .map_err(|e| anyhow!("drawing {caption}: {e:?}"))?;
        let shade = RGBColor(255, 228, 196).filled();
        chart
            .draw_series(
                marks
                    .loss
                    .iter()
                    .map(|(a, b)| Rectangle::new([(minutes(*a), 0.0), (minutes(*b), top)], shade)),
            )
            .map_err(|e| anyhow!("drawing {caption}: {e:?}"))?;
        for (at, colour) in marks
            .cloud
            .iter()
            .map(|a| (a, RGBColor(214, 39, 40)))
            .chain(marks.adapter.iter().map(|a| (a, RGBColor(40, 40, 40))))
        {
            let x = minutes(*at);
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(x, 0.0), (x, top)],
                    colour.stroke_width(1),
                )))
                .map_err(|e| anyhow!("drawing {caption}: {e:?}"))?;
        }
        for (daemon, (colour, width)) in DAEMONS.iter().zip(LINES) {
            let points = samples
                .iter()
                .filter(|s| s.daemon == *daemon)
                .map(|s| (minutes(s.at), value(&s.figures)));
            chart
                .draw_series(LineSeries::new(points, colour.stroke_width(width)))
                .map_err(|e| anyhow!("drawing {caption}: {e:?}"))?
                .label(*daemon)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(width))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| anyhow!("drawing {caption}'s legend: {e:?}"))?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// Registers DejaVu Sans as the plot's `sans-serif` once per process.
fn font() -> anyhow::Result<()> {
    static FONT: OnceLock<Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let (path, bytes) = FONTS
            .iter()
            .find_map(|p| std::fs::read(p).ok().map(|b| (p, b)))
            .ok_or_else(|| {
                format!(
                    "no font for the plot (looked for {}): install fonts-dejavu-core",
                    FONTS.join(", ")
                )
            })?;
        // The font lives as long as the process: plotters keeps a reference to it.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| format!("{path} is not a font plotters can read"))
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_become_restarts_and_loss_periods() {
        let ev = |at: u64, w: &str| (at, w.to_owned());
        let events = [
            ev(60, LOSS_ON),
            ev(100, CLOUD_RESTARTED),
            ev(120, LOSS_OFF),
            ev(140, ADAPTER_RESTARTED),
            ev(180, LOSS_ON),
            ev(190, "something else"),
        ];
        assert_eq!(
            Marks::from_events(&events, 200),
            Marks {
                cloud: vec![100],
                adapter: vec![140],
                loss: vec![(60, 120), (180, 200)],
            }
        );
    }

    #[test]
    fn a_plot_is_drawn_for_a_short_run() {
        let dir = std::env::temp_dir().join(format!("soak-plot-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let samples: Vec<Sample> = (0..10u64)
            .flat_map(|i| {
                DAEMONS.iter().map(move |d| Sample {
                    daemon: d,
                    at: i * 60,
                    pid: 1,
                    figures: Figures {
                        rss_kib: 20_000 + i * 10,
                        fds: 30,
                        threads: 8,
                        buffers: 256,
                    },
                })
            })
            .collect();
        let marks = Marks {
            cloud: vec![300],
            adapter: vec![420],
            loss: vec![(240, 480)],
        };
        let path = dir.join("soak.png");
        render(&samples, &marks, 10, &path).unwrap_or_else(|e| panic!("{e:#}"));
        let png = std::fs::read(&path).unwrap_or_default();
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
        assert!(png.len() > 10_000, "{} bytes: an empty picture?", png.len());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
