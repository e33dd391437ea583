//! Small line charts for the status page (issue 41): a time series of the master's
//! history drawn on the server as inline SVG, so that the page needs no script and loads
//! nothing (its `Content-Security-Policy` stays `default-src 'none'`). A pure function of
//! the series, as the page is of the snapshot.
//!
//! A chart is [`WIDTH`] × [`HEIGHT`] in its own units (the page scales it down to fit a
//! narrow window): the values on the y axis from 0 to a round maximum (1, 2 or 5 times a
//! power of ten, above the highest value, so that a flat series is a line across and a
//! spike stays in the frame), the time on the x axis from the span ago to now. Its caption
//! gives the unit, the legend the series and the span. A `<title>`, a `<desc>` and the
//! `aria-label` say the same in words (each series' latest, lowest and highest value), for
//! a screen reader and for a browser that shows no SVG. Every string is escaped for XML.

use std::fmt::Write as _;

/// The chart's width and height, in SVG user units (CSS pixels at full size).
pub(crate) const WIDTH: u32 = 540;
pub(crate) const HEIGHT: u32 = 184;

/// The plot area inside the frame: left of it the y labels, above it the caption, below
/// it the time labels and the legend.
const LEFT: f64 = 48.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 24.0;
const PLOT_HEIGHT: f64 = 118.0;

/// One line of a chart.
#[derive(Debug, Clone)]
pub(crate) struct Series<'a> {
    /// Its name in the legend and the text alternative.
    pub(crate) name: &'a str,
    /// Its colour (an SVG colour: `#1f77b4`).
    pub(crate) colour: &'a str,
    /// (seconds before now, value), oldest first; `None` where there is no value (a gap
    /// in the line: no request to measure a latency of).
    pub(crate) points: Vec<(f64, Option<f64>)>,
}

/// A chart: its series over the last `span` seconds.
#[derive(Debug, Clone)]
pub(crate) struct Chart<'a> {
    /// The SVG element's `id` (the title's and description's are made from it).
    pub(crate) id: &'a str,
    /// What it shows: "Requests per second".
    pub(crate) title: &'a str,
    /// The values' unit, written above the y axis: "requests/s", "ms".
    pub(crate) unit: &'a str,
    /// The time the x axis spans, in seconds (a multiple of a minute reads best).
    pub(crate) span: f64,
    /// What the chart says with no value at all.
    pub(crate) empty: &'a str,
    pub(crate) series: Vec<Series<'a>>,
}

/// `text` escaped for XML (and HTML) text and attribute values: `&`, `<`, `>`, `"` and `'`
/// become character references; everything else stays.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The y axis' top: the smallest of 1, 2 and 5 times a power of ten that is at least
/// `max` (1 for nothing above zero).
pub(crate) fn axis_top(max: f64) -> f64 {
    if max.is_nan() || max <= 0.0 || max.is_infinite() {
        return 1.0;
    }
    let power = 10f64.powf(max.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|top| *top >= max * (1.0 - 1e-9))
        .unwrap_or(10.0 * power)
}

/// A value for a label: at most three significant figures, no trailing zeros, `k` and
/// `M` for thousands and millions (`0.25`, `12`, `2.5k`, `1M`).
pub(crate) fn number(v: f64) -> String {
    let (v, suffix) = if v.abs() >= 1e6 {
        (v / 1e6, "M")
    } else if v.abs() >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let decimals = if v.abs() >= 100.0 {
        0
    } else if v.abs() >= 10.0 {
        1
    } else {
        2
    };
    let s = format!("{v:.decimals$}");
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        &s
    };
    format!("{s}{suffix}")
}

/// The span in words: `15 min`, `90 s`.
fn span_words(span: f64) -> String {
    if span >= 120.0 && span % 60.0 == 0.0 {
        format!("{} min", span / 60.0)
    } else {
        format!("{} s", number(span))
    }
}

/// The chart as one `<svg>` element (with a final newline): its opening with the text
/// alternative, the caption, the axes, the lines, and the legend.
pub(crate) fn render(c: &Chart<'_>) -> String {
    let plot = Plot::new(c);
    let mut o = String::with_capacity(4096);
    open_svg(&mut o, c);
    caption(&mut o, c);
    y_axis(&mut o, &plot);
    x_axis(&mut o, &plot);
    for s in &c.series {
        line(&mut o, &plot, s);
    }
    if values(c).next().is_none() {
        let _ = write!(
            o,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"currentColor\" opacity=\"0.7\">{}</text>",
            LEFT + plot.width / 2.0,
            TOP + PLOT_HEIGHT / 2.0,
            escape(c.empty)
        );
    }
    legend(&mut o, c);
    o.push_str("</svg>\n");
    o
}

/// The plot area of a chart and its scales: where a value at an age goes.
struct Plot {
    /// The plot area's width (its height is [`PLOT_HEIGHT`], its left edge [`LEFT`]).
    width: f64,
    /// The plot area's bottom edge: the y of 0.
    bottom: f64,
    /// The y axis' top value ([`axis_top`] of the highest value in the span).
    top: f64,
    /// The time the x axis spans, in seconds.
    span: f64,
}

impl Plot {
    fn new(c: &Chart<'_>) -> Plot {
        Plot {
            width: f64::from(WIDTH) - LEFT - RIGHT,
            bottom: TOP + PLOT_HEIGHT,
            top: axis_top(values(c).fold(0.0, f64::max)),
            span: c.span,
        }
    }

    /// The x of a point `age` seconds before now.
    fn x(&self, age: f64) -> f64 {
        LEFT + self.width * (1.0 - age / self.span)
    }

    /// The y of value `v` (clamped to the axis).
    fn y(&self, v: f64) -> f64 {
        self.bottom - PLOT_HEIGHT * (v.clamp(0.0, self.top) / self.top)
    }
}

/// Whether a point `age` seconds old is in a chart's `span`: only those count, for the
/// scale as for the lines.
fn within(span: f64, age: f64) -> bool {
    (0.0..=span).contains(&age)
}

/// The finite values of every series in the span.
fn values<'c>(c: &'c Chart<'_>) -> impl Iterator<Item = f64> + 'c {
    c.series
        .iter()
        .flat_map(|s| s.points.iter())
        .filter(|(age, _)| within(c.span, *age))
        .filter_map(|(_, v)| v.filter(|v| v.is_finite()))
}

/// The `<svg>` element's opening, with its title and description (the text alternative).
fn open_svg(o: &mut String, c: &Chart<'_>) {
    let id = escape(c.id);
    let summary = summary(c);
    let _ = write!(
        o,
        "<svg class=\"chart\" id=\"{id}\" xmlns=\"http://www.w3.org/2000/svg\" \
         viewBox=\"0 0 {WIDTH} {HEIGHT}\" width=\"{WIDTH}\" height=\"{HEIGHT}\" role=\"img\" \
         aria-labelledby=\"{id}-title {id}-desc\" aria-label=\"{}: {}\" \
         font-family=\"system-ui,sans-serif\" font-size=\"11\">\
         <title id=\"{id}-title\">{}</title><desc id=\"{id}-desc\">{}</desc>",
        escape(c.title),
        escape(&summary),
        escape(c.title),
        escape(&summary)
    );
}

/// The caption: the title and, above the y axis, the unit.
fn caption(o: &mut String, c: &Chart<'_>) {
    let _ = write!(
        o,
        "<text x=\"{LEFT}\" y=\"14\" font-weight=\"600\" fill=\"currentColor\">{}</text>\
         <text x=\"{}\" y=\"14\" text-anchor=\"end\" fill=\"currentColor\" opacity=\"0.7\">{}</text>",
        escape(c.title),
        f64::from(WIDTH) - RIGHT,
        escape(c.unit)
    );
}

/// The y axis: 0, half and the top, with grid lines.
fn y_axis(o: &mut String, plot: &Plot) {
    for v in [0.0, plot.top / 2.0, plot.top] {
        let gy = plot.y(v);
        let _ = write!(
            o,
            "<line x1=\"{LEFT}\" y1=\"{gy:.1}\" x2=\"{:.1}\" y2=\"{gy:.1}\" stroke=\"#888\" \
             stroke-opacity=\"{}\" stroke-width=\"1\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"currentColor\">{}</text>",
            LEFT + plot.width,
            if v == 0.0 { "0.8" } else { "0.3" },
            LEFT - 5.0,
            gy + 4.0,
            number(v)
        );
    }
}

/// The x axis: ticks at each third of the span, labelled with the time before now.
fn x_axis(o: &mut String, plot: &Plot) {
    let bottom = plot.bottom;
    for i in 0..=3 {
        let age = plot.span * f64::from(3 - i) / 3.0;
        let tx = plot.x(age);
        let label = if i == 3 {
            "now".to_owned()
        } else {
            format!("\u{2212}{}", span_words(age))
        };
        let anchor = match i {
            0 => "start",
            3 => "end",
            _ => "middle",
        };
        let _ = write!(
            o,
            "<line x1=\"{tx:.1}\" y1=\"{bottom}\" x2=\"{tx:.1}\" y2=\"{}\" stroke=\"#888\"/>\
             <text x=\"{tx:.1}\" y=\"{}\" text-anchor=\"{anchor}\" fill=\"currentColor\">{label}</text>",
            bottom + 4.0,
            bottom + 16.0
        );
    }
}

/// One series' line: each run of values without a gap is a polyline (a lone value a
/// dot).
fn line(o: &mut String, plot: &Plot, s: &Series<'_>) {
    let colour = escape(s.colour);
    let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
    for (age, v) in s.points.iter().filter(|(age, _)| within(plot.span, *age)) {
        match v.filter(|v| v.is_finite()) {
            Some(v) => runs.last_mut().unwrap().push((plot.x(*age), plot.y(v))),
            None if runs.last().is_some_and(|r| !r.is_empty()) => runs.push(Vec::new()),
            None => {}
        }
    }
    for run in runs.iter().filter(|r| !r.is_empty()) {
        if let [(px, py)] = run.as_slice() {
            let _ = write!(
                o,
                "<circle cx=\"{px:.1}\" cy=\"{py:.1}\" r=\"1.8\" fill=\"{colour}\"/>"
            );
            continue;
        }
        o.push_str("<polyline fill=\"none\" stroke-width=\"1.6\" stroke-linejoin=\"round\" stroke=\"");
        o.push_str(&colour);
        o.push_str("\" points=\"");
        for (i, (px, py)) in run.iter().enumerate() {
            let _ = write!(o, "{}{px:.1},{py:.1}", if i > 0 { " " } else { "" });
        }
        o.push_str("\"/>");
    }
}

/// The legend: each series' colour and name, then the span.
fn legend(o: &mut String, c: &Chart<'_>) {
    let mut lx = LEFT;
    let ly = f64::from(HEIGHT) - 8.0;
    for s in &c.series {
        let _ = write!(
            o,
            "<rect x=\"{lx:.1}\" y=\"{:.1}\" width=\"10\" height=\"3\" fill=\"{}\"/>\
             <text x=\"{:.1}\" y=\"{ly:.1}\" fill=\"currentColor\">{}</text>",
            ly - 4.0,
            escape(s.colour),
            lx + 14.0,
            escape(s.name)
        );
        lx += 14.0 + 6.5 * s.name.chars().count() as f64 + 14.0;
    }
    let _ = write!(
        o,
        "<text x=\"{}\" y=\"{ly:.1}\" text-anchor=\"end\" fill=\"currentColor\" opacity=\"0.7\">last {}</text>",
        f64::from(WIDTH) - RIGHT,
        span_words(c.span)
    );
}

/// The chart in words: per series, its latest, lowest and highest value over the span.
fn summary(c: &Chart<'_>) -> String {
    let mut parts = Vec::new();
    for s in &c.series {
        let values: Vec<f64> = s
            .points
            .iter()
            .filter(|(age, _)| (0.0..=c.span).contains(age))
            .filter_map(|(_, v)| v.filter(|v| v.is_finite()))
            .collect();
        let Some(last) = values.last() else {
            continue;
        };
        let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        parts.push(format!(
            "{} latest {}, lowest {}, highest {}",
            s.name,
            number(*last),
            number(lo),
            number(hi)
        ));
    }
    let span = span_words(c.span);
    if parts.is_empty() {
        format!("over the last {span}, in {}: {}", c.unit, c.empty)
    } else {
        format!("over the last {span}, in {}: {}", c.unit, parts.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart<'a>(series: Vec<Series<'a>>) -> Chart<'a> {
        Chart {
            id: "chart-test",
            title: "Requests per second",
            unit: "requests/s",
            span: 900.0,
            empty: "no samples yet",
            series,
        }
    }

    /// A series of one point every 5 s over the span, value `f(i)` for the i-th.
    fn every_5_s(f: impl Fn(usize) -> Option<f64>) -> Vec<(f64, Option<f64>)> {
        (0..180).map(|i| (5.0 * (179 - i) as f64, f(i))).collect()
    }

    /// The (x, y) pairs of every polyline of `svg`.
    fn polylines(svg: &str) -> Vec<Vec<(f64, f64)>> {
        svg.split("<polyline ")
            .skip(1)
            .map(|p| {
                let from = p.find(" points=\"").unwrap() + 9;
                let to = from + p[from..].find('"').unwrap();
                p[from..to]
                    .split(' ')
                    .map(|xy| {
                        let (x, y) = xy.split_once(',').unwrap();
                        (x.parse().unwrap(), y.parse().unwrap())
                    })
                    .collect()
            })
            .collect()
    }

    /// The view box's bounds: every point of every line is inside the plot area.
    fn inside_plot(points: &[(f64, f64)]) -> bool {
        points.iter().all(|&(x, y)| {
            (LEFT - 0.05..=f64::from(WIDTH) - RIGHT + 0.05).contains(&x)
                && (TOP - 0.05..=TOP + PLOT_HEIGHT + 0.05).contains(&y)
        })
    }

    #[test]
    fn issue_41_a_chart_is_an_svg_with_its_text_alternative() {
        let svg = render(&chart(vec![Series {
            name: "requests",
            colour: "#1f77b4",
            points: every_5_s(|i| Some(i as f64)),
        }]));
        assert!(svg.starts_with("<svg class=\"chart\" id=\"chart-test\""), "{svg}");
        assert!(svg.ends_with("</svg>\n"), "{svg}");
        assert!(svg.contains("role=\"img\""), "{svg}");
        assert!(
            svg.contains("<title id=\"chart-test-title\">Requests per second</title>"),
            "{svg}"
        );
        assert!(
            svg.contains(
                "<desc id=\"chart-test-desc\">over the last 15 min, in requests/s: requests latest 179, lowest 0, highest 179</desc>"
            ),
            "{svg}"
        );
        assert!(
            svg.contains("aria-label=\"Requests per second: over the last 15 min"),
            "{svg}"
        );
        // The axes: the unit, the time span and its labels, the scale's top.
        for needle in [
            ">requests/s</text>",
            ">\u{2212}15 min</text>",
            ">\u{2212}5 min</text>",
            ">now</text>",
            ">last 15 min</text>",
            ">200</text>",
            ">100</text>",
            ">0</text>",
        ] {
            assert!(svg.contains(needle), "no {needle} in {svg}");
        }
        assert!(!svg.contains("<script") && !svg.contains("href"), "{svg}");
    }

    /// Values are scaled into the plot: the oldest point at the left edge, now at the right
    /// one, zero on the x axis, the highest value under the top; the scale's top is a round
    /// number above the highest value.
    #[test]
    fn issue_41_values_are_scaled_into_the_view_box() {
        let svg = render(&chart(vec![Series {
            name: "requests",
            colour: "#1f77b4",
            points: vec![(900.0, Some(0.0)), (450.0, Some(40.0)), (0.0, Some(80.0))],
        }]));
        let lines = polylines(&svg);
        assert_eq!(lines.len(), 1, "{svg}");
        let pts = &lines[0];
        assert!(inside_plot(pts), "{pts:?}");
        let plot_width = f64::from(WIDTH) - LEFT - RIGHT;
        assert!(
            (pts[0].0 - LEFT).abs() < 0.05 && (pts[2].0 - (LEFT + plot_width)).abs() < 0.05,
            "{pts:?}"
        );
        assert!((pts[1].0 - (LEFT + plot_width / 2.0)).abs() < 0.05, "{pts:?}");
        // 0 at the bottom; the top is 100 (80 rounded up): 40 and 80 at 40 % and 80 %.
        let bottom = TOP + PLOT_HEIGHT;
        assert!((pts[0].1 - bottom).abs() < 0.05, "{pts:?}");
        assert!((pts[1].1 - (bottom - 0.4 * PLOT_HEIGHT)).abs() < 0.05, "{pts:?}");
        assert!((pts[2].1 - (bottom - 0.8 * PLOT_HEIGHT)).abs() < 0.05, "{pts:?}");
        assert!(svg.contains(">100</text>"), "{svg}");
        // Points older than the span are left out, for the scale too.
        let svg = render(&chart(vec![Series {
            name: "requests",
            colour: "#1f77b4",
            points: vec![(2000.0, Some(1e6)), (10.0, Some(3.0)), (0.0, Some(3.0))],
        }]));
        assert!(svg.contains(">5</text>") && !svg.contains("1M"), "{svg}");
        assert_eq!(polylines(&svg)[0].len(), 2, "{svg}");
    }

    #[test]
    fn issue_41_a_flat_series_is_a_line_across() {
        for level in [0.0, 7.0] {
            let svg = render(&chart(vec![Series {
                name: "connections",
                colour: "#2ca02c",
                points: every_5_s(|_| Some(level)),
            }]));
            let lines = polylines(&svg);
            assert_eq!(lines.len(), 1, "{svg}");
            let ys: Vec<f64> = lines[0].iter().map(|p| p.1).collect();
            assert!(ys.iter().all(|y| (*y - ys[0]).abs() < 1e-9), "flat: {ys:?}");
            assert!(inside_plot(&lines[0]), "{svg}");
            assert_eq!(lines[0].len(), 180);
        }
        // Zero: on the x axis, with a scale of 0 to 1.
        let svg = render(&chart(vec![Series {
            name: "errors",
            colour: "#d62728",
            points: every_5_s(|_| Some(0.0)),
        }]));
        assert!(svg.contains(">1</text>") && svg.contains(">0.5</text>"), "{svg}");
    }

    /// A spike stays in the frame and sets the scale; the rest of the line is low.
    #[test]
    fn issue_41_a_spike_stays_in_the_frame() {
        let svg = render(&chart(vec![Series {
            name: "requests",
            colour: "#1f77b4",
            points: every_5_s(|i| Some(if i == 100 { 12_345.0 } else { 10.0 })),
        }]));
        let pts = &polylines(&svg)[0];
        assert!(inside_plot(pts), "{pts:?}");
        let top = pts.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
        assert!(
            top > TOP - 0.05 && top < TOP + 0.5 * PLOT_HEIGHT,
            "the spike in the upper half: {top}"
        );
        assert!(svg.contains(">20k</text>"), "the scale's top is 20k: {svg}");
        assert!(svg.contains("highest 12.3k"), "{svg}");
    }

    #[test]
    fn issue_41_an_empty_history_says_so() {
        let svg = render(&chart(vec![Series {
            name: "requests",
            colour: "#1f77b4",
            points: Vec::new(),
        }]));
        assert!(!svg.contains("<polyline") && !svg.contains("<circle"), "{svg}");
        assert!(svg.contains(">no samples yet</text>"), "{svg}");
        assert!(
            svg.contains(
                "<desc id=\"chart-test-desc\">over the last 15 min, in requests/s: no samples yet</desc>"
            ),
            "{svg}"
        );
        // The axes are there all the same, 0 to 1.
        assert!(svg.contains(">now</text>") && svg.contains(">1</text>"), "{svg}");
    }

    /// Gaps (no value: no request to time) break the line; a lone value is a dot.
    #[test]
    fn issue_41_gaps_break_the_line() {
        let svg = render(&chart(vec![Series {
            name: "p50",
            colour: "#1f77b4",
            points: every_5_s(|i| match i {
                0..=9 => Some(2.0),
                10..=19 => None,
                20 => Some(3.0),
                21..=29 => None,
                _ => Some(1.0),
            }),
        }]));
        let lines = polylines(&svg);
        assert_eq!(lines.iter().map(Vec::len).collect::<Vec<_>>(), [10, 150], "{svg}");
        assert_eq!(svg.matches("<circle").count(), 1, "{svg}");
    }

    #[test]
    fn issue_41_labels_are_escaped() {
        let c = Chart {
            id: "a\"b",
            title: "<b>Latency</b> & more",
            unit: "'ms'",
            span: 900.0,
            empty: "<none>",
            series: vec![Series {
                name: "p<50>",
                colour: "\"red",
                points: vec![(0.0, Some(1.0)), (5.0, Some(2.0))],
            }],
        };
        let svg = render(&c);
        for raw in ["<b>", "\"red", "'ms'", "p<50>", "a\"b", "<none>"] {
            assert!(!svg.contains(raw), "{raw} unescaped in {svg}");
        }
        for escaped in [
            "&lt;b&gt;Latency&lt;/b&gt; &amp; more",
            "&quot;red",
            "&#39;ms&#39;",
            "p&lt;50&gt;",
            "id=\"a&quot;b\"",
        ] {
            assert!(svg.contains(escaped), "no {escaped} in {svg}");
        }
    }

    #[test]
    fn issue_41_round_scales_and_short_numbers() {
        assert_eq!(axis_top(0.0), 1.0);
        assert_eq!(axis_top(f64::NAN), 1.0);
        assert_eq!(axis_top(0.3), 0.5);
        assert_eq!(axis_top(1.0), 1.0);
        assert_eq!(axis_top(1.01), 2.0);
        assert_eq!(axis_top(4.2), 5.0);
        assert_eq!(axis_top(51.0), 100.0);
        assert_eq!(axis_top(12_345.0), 20_000.0);
        assert_eq!(number(0.0), "0");
        assert_eq!(number(0.25), "0.25");
        assert_eq!(number(12.0), "12");
        assert_eq!(number(12.34), "12.3");
        assert_eq!(number(250.0), "250");
        assert_eq!(number(2500.0), "2.5k");
        assert_eq!(number(20_000.0), "20k");
        assert_eq!(number(1_000_000.0), "1M");
    }

    /// Two charts of a small fixed history, whole: two series (one with a gap, a lone
    /// value, a point older than the span and a non-finite value), escapes, a span in
    /// seconds; and a chart with no value. Pinned byte for byte (issue 43: `render` was cut
    /// into its parts, which changed no byte), so that a change to the SVG is deliberate:
    /// it updates `tests/data/render/chart*.svg`.
    fn issue_43_pinned_charts() -> [(Chart<'static>, &'static str); 2] {
        let full = Chart {
            id: "latency",
            title: "Latency & more",
            unit: "ms",
            span: 90.0,
            empty: "no request yet",
            series: vec![
                Series {
                    name: "p50",
                    colour: "#1f77b4",
                    points: vec![
                        (120.0, Some(99.0)),
                        (90.0, Some(1.5)),
                        (75.0, Some(2.0)),
                        (60.0, None),
                        (45.0, Some(3.25)),
                        (30.0, None),
                        (15.0, Some(f64::NAN)),
                        (5.0, Some(2.5)),
                        (0.0, Some(4.0)),
                    ],
                },
                Series {
                    name: "p<99>",
                    colour: "#d62728",
                    points: vec![(60.0, Some(7.0)), (30.0, Some(12.5)), (0.0, Some(9.0))],
                },
            ],
        };
        let empty = Chart {
            id: "requests",
            title: "Requests per second",
            unit: "requests/s",
            span: 900.0,
            empty: "no samples yet",
            series: vec![Series {
                name: "requests",
                colour: "#2ca02c",
                points: vec![(0.0, None)],
            }],
        };
        [
            (full, include_str!("../../tests/data/render/chart.svg")),
            (empty, include_str!("../../tests/data/render/chart-empty.svg")),
        ]
    }

    #[test]
    fn issue_43_the_svg_of_a_fixed_history_is_pinned() {
        for (chart, want) in issue_43_pinned_charts() {
            let got = render(&chart);
            assert!(got == want, "{} differs:\n got: {got}\nwant: {want}", chart.id);
        }
    }
}
