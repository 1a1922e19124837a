//! Line charts as inline SVG, written by hand.
//!
//! Hand-written because the page must stand alone and the charts are
//! simple: axes with five ticks, one polyline per series, a legend. Every
//! data point is also a `<circle>` with a `<title>` (a hover tooltip) and
//! `data-x`/`data-y` attributes holding the exact values, so the plotted
//! data can be read back from the file by people and tests alike.

use super::escape;

/// Colours of successive series (colour-blind-safe palette, Okabe-Ito).
const PALETTE: [&str; 8] = [
    "#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#f0e442", "#000000",
];
/// Width of the plot area; the legend to its right widens the chart to fit
/// the longest series name.
const PLOT_WIDTH: f64 = 438.0;
const HEIGHT: f64 = 360.0;
const LEFT: f64 = 72.0;
/// Legend column width at least; about 7.6 px per character beyond.
const MIN_RIGHT: f64 = 170.0;
const TOP: f64 = 34.0;
const BOTTOM: f64 = 52.0;

/// One named line of `(x, y)` points, drawn in the order given.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend name.
    pub name: String,
    /// The points.
    pub points: Vec<(f64, f64)>,
}

/// A line chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    /// Title above the plot.
    pub title: String,
    /// X axis label.
    pub x_label: String,
    /// Y axis label.
    pub y_label: String,
    /// The lines.
    pub series: Vec<Series>,
    /// Start the y axis at 0 rather than at the smallest value.
    pub y_from_zero: bool,
    /// Logarithmic x axis (points with x <= 0 are left out).
    pub x_log: bool,
}

/// `v` for a label: integers plainly, small magnitudes in scientific
/// notation, anything else with four decimals.
pub fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        return "n/a".to_owned();
    }
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else if v != 0.0 && v.abs() < 1e-3 {
        format!("{v:.3e}")
    } else {
        format!("{v:.4}")
    }
}

/// A tick label: as many decimals as the distance between ticks needs
/// (a 866-wide step gets none, a 0.09 step two, a 0.25 step one), so axes read as round
/// numbers while data points keep [`fmt_num`]'s precision.
pub fn fmt_tick(v: f64, step: f64) -> String {
    if !v.is_finite() {
        return "n/a".to_owned();
    }
    let decimals = if step > 0.0 && step.is_finite() {
        (-(step.log10().floor() as i32)).clamp(0, 4) as usize
    } else {
        2
    };
    format!("{v:.decimals$}")
}

fn range(values: impl Iterator<Item = f64>, from_zero: bool) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.filter(|v| v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    if from_zero {
        lo = lo.min(0.0);
    }
    if hi - lo <= f64::EPSILON * hi.abs().max(1.0) {
        hi = lo + lo.abs().max(1.0);
    }
    (lo, hi)
}

/// The chart as one `<svg>` element.
pub fn line_chart(chart: &Chart) -> String {
    // Positions are computed on `tx(x)`: log10(x) on a log axis.
    let tx = |x: f64| {
        if !chart.x_log {
            x
        } else if x > 0.0 {
            x.log10()
        } else {
            f64::NAN
        }
    };
    let untx = |v: f64| if chart.x_log { 10f64.powf(v) } else { v };
    let points = || chart.series.iter().flat_map(|s| s.points.iter());
    let (x0, x1) = range(points().map(|p| tx(p.0)), false);
    let (y0, y1) = range(points().map(|p| p.1), chart.y_from_zero);
    let longest = chart
        .series
        .iter()
        .map(|s| s.name.chars().count())
        .max()
        .unwrap_or(0);
    let right = MIN_RIGHT.max(48.0 + 7.6 * longest as f64);
    let pw = PLOT_WIDTH;
    let width = LEFT + pw + right;
    let ph = HEIGHT - TOP - BOTTOM;
    let sx = |x: f64| LEFT + (x - x0) / (x1 - x0) * pw;
    let sy = |y: f64| TOP + ph - (y - y0) / (y1 - y0) * ph;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{HEIGHT}\" \
         viewBox=\"0 0 {width} {HEIGHT}\" role=\"img\" aria-label=\"{t}\">\n\
         <title>{t}</title>\n\
         <text x=\"{cx}\" y=\"20\" text-anchor=\"middle\" font-weight=\"bold\">{t}</text>\n\
         <rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{pw}\" height=\"{ph}\" fill=\"none\" stroke=\"#888\"/>\n",
        t = escape(&chart.title),
        cx = LEFT + pw / 2.0,
    );
    for i in 0..=4 {
        let f = f64::from(i) / 4.0;
        let (xv, yv) = (x0 + f * (x1 - x0), y0 + f * (y1 - y0));
        let (x, y) = (sx(xv), sy(yv));
        let xv = untx(xv);
        // Round log-axis tick labels to 3 significant digits.
        let xv = if chart.x_log && xv >= 1.0 {
            let scale = 10f64.powi(xv.log10().floor() as i32 - 2).max(1.0);
            (xv / scale).round() * scale
        } else {
            xv
        };
        s.push_str(&format!(
            "<line x1=\"{x:.1}\" y1=\"{TOP}\" x2=\"{x:.1}\" y2=\"{b}\" stroke=\"#eee\"/>\n\
             <text x=\"{x:.1}\" y=\"{lx}\" text-anchor=\"middle\" font-size=\"11\">{xl}</text>\n\
             <line x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{r}\" y2=\"{y:.1}\" stroke=\"#eee\"/>\n\
             <text x=\"{ly}\" y=\"{y:.1}\" text-anchor=\"end\" font-size=\"11\">{yl}</text>\n",
            b = TOP + ph,
            lx = TOP + ph + 15.0,
            xl = escape(&if chart.x_log {
                fmt_num(xv)
            } else {
                fmt_tick(xv, (x1 - x0) / 4.0)
            }),
            r = LEFT + pw,
            ly = LEFT - 4.0,
            yl = escape(&fmt_tick(yv, (y1 - y0) / 4.0)),
        ));
    }
    s.push_str(&format!(
        "<text x=\"{cx}\" y=\"{by}\" text-anchor=\"middle\" font-size=\"12\">{xl}</text>\n\
         <text x=\"14\" y=\"{my}\" text-anchor=\"middle\" font-size=\"12\" \
         transform=\"rotate(-90 14 {my})\">{yl}</text>\n",
        cx = LEFT + pw / 2.0,
        by = HEIGHT - 10.0,
        xl = escape(&chart.x_label),
        my = TOP + ph / 2.0,
        yl = escape(&chart.y_label),
    ));
    for (i, series) in chart.series.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        let name = escape(&series.name);
        let finite: Vec<(f64, f64)> = series
            .points
            .iter()
            .copied()
            .filter(|&(x, y)| tx(x).is_finite() && y.is_finite())
            .collect();
        let path: Vec<String> = finite
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(tx(x)), sy(y)))
            .collect();
        s.push_str(&format!(
            "<g class=\"series\" data-name=\"{name}\">\n<polyline fill=\"none\" stroke=\"{colour}\" \
             stroke-width=\"2\" points=\"{}\"/>\n",
            path.join(" ")
        ));
        for &(x, y) in &finite {
            let (xs, ys) = (fmt_num(x), fmt_num(y));
            s.push_str(&format!(
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{colour}\" data-x=\"{xs}\" \
                 data-y=\"{ys}\"><title>{name}: x={xs}, y={ys}</title></circle>\n",
                sx(tx(x)),
                sy(y)
            ));
        }
        let ly = TOP + 14.0 + 18.0 * i as f64;
        let lx = LEFT + pw + 12.0;
        s.push_str(&format!(
            "<rect x=\"{lx}\" y=\"{:.1}\" width=\"12\" height=\"12\" fill=\"{colour}\"/>\n\
             <text x=\"{:.1}\" y=\"{ly:.1}\" font-size=\"12\">{name}</text>\n</g>\n",
            ly - 10.0,
            lx + 16.0
        ));
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_labels_round_to_the_step() {
        assert_eq!(fmt_tick(937.305, 866.5), "937");
        assert_eq!(fmt_tick(0.27485, 0.0916), "0.27");
        assert_eq!(fmt_tick(0.5, 0.25), "0.5");
        assert_eq!(fmt_tick(12.0, f64::NAN), "12.00");
    }

    #[test]
    fn numbers_and_degenerate_ranges() {
        assert_eq!(fmt_num(1000.0), "1000");
        assert_eq!(fmt_num(0.25), "0.2500");
        assert_eq!(fmt_num(0.000_082), "8.200e-5");
        assert_eq!(range([3.0, 3.0].into_iter(), false), (3.0, 6.0));
        assert_eq!(range(std::iter::empty(), true), (0.0, 1.0));
        let svg = line_chart(&Chart {
            title: "a<b".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            series: vec![Series {
                name: "s&t".into(),
                points: vec![(1.0, f64::NAN), (2.0, 0.5)],
            }],
            y_from_zero: true,
            x_log: false,
        });
        assert!(svg.contains("a&lt;b") && svg.contains("s&amp;t"));
        assert_eq!(svg.matches("<circle").count(), 1);
        let log = line_chart(&Chart {
            title: "t".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            series: vec![Series {
                name: "s".into(),
                points: vec![(0.0, 1.0), (10.0, 1.0), (1000.0, 2.0)],
            }],
            y_from_zero: false,
            x_log: true,
        });
        // x = 0 has no place on a log axis; 10 and 1000 span the plot.
        assert_eq!(log.matches("<circle").count(), 2);
        assert!(log.contains("cx=\"72.0\"") && log.contains(">100</text>"));
    }
}
