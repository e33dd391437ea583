//! `bench-charts`: SVG charts of the CSV files that `bench/compare.sh` writes.
//!
//! ```text
//! bench-charts RESULTS_DIR CHARTS_DIR      (bench/compare.sh runs: bench-charts bench/results bench/charts)
//! ```
//!
//! Every `RESULTS_DIR/NAME.csv` becomes `CHARTS_DIR/NAME.svg`, by its header:
//!
//! - `server,concurrency,keepalive,rps,...` (one file per workload): requests/s against
//!   concurrency (a logarithmic axis with a tick at each concurrency measured), one line per
//!   server, keep-alive on the left and a new connection per request on the right, both on
//!   the same scale;
//! - `server,phase,processes,pss_kb` (memory): a pair of bars per server, summed PSS idle and
//!   after the load, each labelled with its MiB and process count.
//!
//! Other CSV files (syscalls.csv) are skipped. A cell without a figure (an empty `rps`: no
//! run finished) leaves a gap in its line. Exit status: 0, or 1 with the reason on stderr.

use std::collections::BTreeSet;
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// One line of a throughput CSV.
#[derive(Debug, Clone, PartialEq)]
struct Cell {
    server: String,
    concurrency: u32,
    keep_alive: bool,
    /// Median requests/s; `None` when no run finished.
    rps: Option<f64>,
}

/// One line of a memory CSV.
#[derive(Debug, Clone, PartialEq)]
struct Memory {
    server: String,
    phase: String,
    processes: u32,
    pss_kb: u64,
}

#[derive(Debug, PartialEq)]
enum Table {
    Throughput(Vec<Cell>),
    Memory(Vec<Memory>),
    /// A CSV file of another kind.
    Other,
}

/// A parse error, with its line number (1-based).
#[derive(Debug, PartialEq)]
struct ParseError {
    line: usize,
    reason: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.reason)
    }
}

/// The fields of one CSV line: comma-separated, a field may be double-quoted (a quote in it
/// doubled).
fn fields(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => out.push(std::mem::take(&mut field)),
            _ => field.push(c),
        }
    }
    out.push(field);
    out
}

fn parse_table(text: &str) -> Result<Table, ParseError> {
    let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty());
    let Some((_, head)) = lines.next() else {
        return Ok(Table::Other);
    };
    let head = fields(head.trim_end_matches('\r'));
    let col = |name: &str| head.iter().position(|h| h == name);
    let err = |line: usize, reason: String| ParseError {
        line: line + 1,
        reason,
    };
    if head.len() >= 4 && head[..4] == ["server", "concurrency", "keepalive", "rps"] {
        let mut cells = Vec::new();
        for (n, line) in lines {
            let f = fields(line.trim_end_matches('\r'));
            if f.len() < 4 {
                return Err(err(n, format!("{} fields, expected at least 4", f.len())));
            }
            let concurrency = f[1]
                .parse()
                .map_err(|_| err(n, format!("bad concurrency {:?}", f[1])))?;
            let keep_alive = match f[2].as_str() {
                "1" | "true" => true,
                "0" | "false" => false,
                other => return Err(err(n, format!("bad keepalive {other:?}"))),
            };
            let rps = match f[3].as_str() {
                "" | "-" => None,
                s => Some(
                    s.parse::<f64>()
                        .ok()
                        .filter(|v| v.is_finite() && *v >= 0.0)
                        .ok_or_else(|| err(n, format!("bad rps {s:?}")))?,
                ),
            };
            cells.push(Cell {
                server: f[0].clone(),
                concurrency,
                keep_alive,
                rps,
            });
        }
        return Ok(Table::Throughput(cells));
    }
    if let (Some(s), Some(ph), Some(pr), Some(kb)) =
        (col("server"), col("phase"), col("processes"), col("pss_kb"))
    {
        let mut rows = Vec::new();
        for (n, line) in lines {
            let f = fields(line.trim_end_matches('\r'));
            let get = |i: usize| f.get(i).map(String::as_str).unwrap_or("");
            rows.push(Memory {
                server: get(s).to_string(),
                phase: get(ph).to_string(),
                processes: get(pr)
                    .parse()
                    .map_err(|_| err(n, format!("bad processes {:?}", get(pr))))?,
                pss_kb: get(kb)
                    .parse()
                    .map_err(|_| err(n, format!("bad pss_kb {:?}", get(kb))))?,
            });
        }
        return Ok(Table::Memory(rows));
    }
    Ok(Table::Other)
}

/// The servers in the order they first appear.
fn servers<'a>(names: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut seen = Vec::<String>::new();
    for n in names {
        if !seen.iter().any(|s| s == n) {
            seen.push(n.to_string());
        }
    }
    seen
}

/// The name shown for a server id of bench/compare.sh.
fn display_name(id: &str) -> &str {
    match id {
        "apache" => "Apache prefork",
        "php-fpm" => "nginx + PHP-FPM",
        "mod_php" => "Apache prefork + mod_php",
        "redis" => "Redis",
        "netserver" => "Net::Server::PreFork",
        other => other,
    }
}

/// The title of a chart, from its file's name.
fn title(stem: &str) -> String {
    match stem {
        "hello-dynamic" => "13-byte dynamic Hello, World! (requests/s)".into(),
        "hello-static" => "13-byte static file (requests/s)".into(),
        "static-100k" => "100 KB static file (requests/s)".into(),
        "static-1m" => "1 MB static file (requests/s)".into(),
        "ping" => "Inline PING -> +PONG (requests/s)".into(),
        "memory" => "Memory of the HTTP servers: summed PSS".into(),
        "ping-memory" => "Memory of the PING servers: summed PSS".into(),
        other => other.to_string(),
    }
}

/// A fixed color per server, so that a server keeps its color across charts.
fn color(id: &str, index: usize) -> RGBColor {
    const PALETTE: [RGBColor; 8] = [
        RGBColor(0xd6, 0x27, 0x28),
        RGBColor(0x1f, 0x77, 0xb4),
        RGBColor(0x2c, 0xa0, 0x2c),
        RGBColor(0xff, 0x7f, 0x0e),
        RGBColor(0x94, 0x67, 0xbd),
        RGBColor(0x8c, 0x56, 0x4b),
        RGBColor(0xe3, 0x77, 0xc2),
        RGBColor(0x7f, 0x7f, 0x7f),
    ];
    let i = match id {
        "appsrv" => 0,
        "nginx" | "redis" => 1,
        "apache" | "netserver" => 2,
        "php-fpm" => 3,
        "mod_php" => 4,
        _ => 5 + index % 3,
    };
    PALETTE[i]
}

type DrawResult = Result<(), Box<dyn std::error::Error>>;

fn throughput_chart(cells: &[Cell], name: &str, out: &Path) -> DrawResult {
    let levels: Vec<f64> = cells
        .iter()
        .map(|c| c.concurrency)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .map(f64::from)
        .collect();
    if levels.is_empty() {
        return Err("no data".into());
    }
    let (lo, hi) = (levels[0] * 0.8, levels[levels.len() - 1] * 1.25);
    let top = cells
        .iter()
        .filter_map(|c| c.rps)
        .fold(0.0_f64, f64::max)
        .max(1.0)
        * 1.12;
    let ids = servers(cells.iter().map(|c| c.server.as_str()));

    let root = SVGBackend::new(out, (1100, 460)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(name, ("sans-serif", 20))?;
    let panels = root.split_evenly((1, 2));
    for (panel, keep_alive) in panels.iter().zip([true, false]) {
        let caption = if keep_alive {
            "keep-alive"
        } else {
            "a new connection per request"
        };
        let mut chart = ChartBuilder::on(panel)
            .caption(caption, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d((lo..hi).log_scale().with_key_points(levels.clone()), 0.0..top)?;
        chart
            .configure_mesh()
            .x_desc("concurrent connections (ab -c)")
            .y_desc("requests/s")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| {
                if top >= 10_000.0 {
                    format!("{:.0}k", y / 1000.0)
                } else {
                    format!("{y:.0}")
                }
            })
            .light_line_style(WHITE)
            .draw()?;
        for (i, id) in ids.iter().enumerate() {
            let c = color(id, i);
            let mut points: Vec<(u32, Option<f64>)> = cells
                .iter()
                .filter(|x| &x.server == id && x.keep_alive == keep_alive)
                .map(|x| (x.concurrency, x.rps))
                .collect();
            points.sort_by_key(|p| p.0);
            // A missing figure breaks the line into segments.
            let mut labelled = false;
            for segment in points.split(|p| p.1.is_none()) {
                if segment.is_empty() {
                    continue;
                }
                let line = segment.iter().filter_map(|&(x, y)| y.map(|y| (f64::from(x), y)));
                let series = chart.draw_series(LineSeries::new(line, c.stroke_width(2)).point_size(3))?;
                if !labelled {
                    series
                        .label(display_name(id))
                        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
                    labelled = true;
                }
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .label_font(("sans-serif", 13))
            .draw()?;
    }
    root.present()?;
    Ok(())
}

fn memory_chart(rows: &[Memory], name: &str, out: &Path) -> DrawResult {
    let ids = servers(rows.iter().map(|r| r.server.as_str()));
    let phases = servers(rows.iter().map(|r| r.phase.as_str()));
    if ids.is_empty() {
        return Err("no data".into());
    }
    let mib = |kb: u64| kb as f64 / 1024.0;
    let top = rows
        .iter()
        .map(|r| mib(r.pss_kb))
        .fold(0.0_f64, f64::max)
        .max(1.0)
        * 1.15;
    // Server i spans x = 10 i .. 10 i + 10 (integer coordinates: a key point, its label,
    // at the center); its bars share the 8 units in the middle.
    let n = ids.len() as i32;
    let root = SVGBackend::new(out, (160 * ids.len() as u32 + 160, 460)).into_drawing_area();
    root.fill(&WHITE)?;
    let centers: Vec<i32> = (0..n).map(|i| 10 * i + 5).collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(name, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((0..10 * n).with_key_points(centers), 0.0..top)?;
    let label_ids = ids.clone();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .light_line_style(WHITE)
        .y_desc("PSS, MiB (all the server's processes)")
        .x_label_formatter(&|x| {
            let i = (x / 10) as usize;
            if x % 10 == 5 && i < label_ids.len() {
                display_name(&label_ids[i]).to_string()
            } else {
                String::new()
            }
        })
        .draw()?;
    let width = 8 / phases.len().clamp(1, 8) as i32;
    let shades = [
        RGBColor(0x9e, 0xc5, 0xe8),
        RGBColor(0x1f, 0x77, 0xb4),
        RGBColor(0x7f, 0x7f, 0x7f),
    ];
    for (p, phase) in phases.iter().enumerate() {
        let fill = shades[p.min(shades.len() - 1)];
        let bars: Vec<&Memory> = rows.iter().filter(|r| &r.phase == phase).collect();
        let place = |r: &Memory| {
            let i = ids.iter().position(|s| *s == r.server).unwrap_or(0) as i32;
            10 * i + 1 + width * p as i32
        };
        let series = chart.draw_series(bars.iter().map(|r| {
            Rectangle::new(
                [(place(r), 0.0), (place(r) + width, mib(r.pss_kb))],
                fill.filled(),
            )
        }))?;
        series
            .label(match phase.as_str() {
                "idle" => "idle, after start",
                "after" => "after the last run (keep-alive, highest c)",
                other => other,
            })
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], fill.filled()));
        chart.draw_series(bars.iter().map(|r| {
            Text::new(
                format!("{:.1} MiB, {} p.", mib(r.pss_kb), r.processes),
                (place(r) + width / 2, mib(r.pss_kb) + top * 0.01),
                ("sans-serif", 11)
                    .into_font()
                    .color(&BLACK)
                    .pos(Pos::new(HPos::Center, VPos::Bottom)),
            )
        }))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .draw()?;
    root.present()?;
    Ok(())
}

fn run(results: &Path, charts: &Path) -> Result<Vec<PathBuf>, String> {
    let mut inputs: Vec<PathBuf> = fs::read_dir(results)
        .map_err(|e| format!("{}: {e}", results.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "csv"))
        .collect();
    inputs.sort();
    fs::create_dir_all(charts).map_err(|e| format!("{}: {e}", charts.display()))?;
    let mut written = Vec::new();
    for input in inputs {
        let text = fs::read_to_string(&input).map_err(|e| format!("{}: {e}", input.display()))?;
        let table = parse_table(&text).map_err(|e| format!("{}: {e}", input.display()))?;
        let stem = input
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let out = charts.join(format!("{stem}.svg"));
        let drawn = match &table {
            Table::Throughput(cells) if !cells.is_empty() => throughput_chart(cells, &title(&stem), &out),
            Table::Memory(rows) if !rows.is_empty() => memory_chart(rows, &title(&stem), &out),
            _ => continue,
        };
        drawn.map_err(|e| format!("{}: {e}", out.display()))?;
        written.push(out);
    }
    Ok(written)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() != 2 || args[0].starts_with('-') {
        eprintln!("usage: bench-charts RESULTS_DIR CHARTS_DIR   (e.g. bench/results bench/charts)");
        return ExitCode::from(2);
    }
    match run(Path::new(&args[0]), Path::new(&args[1])) {
        Ok(written) => {
            for w in written {
                println!("{}", w.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("bench-charts: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_throughput_file_with_a_missing_figure() {
        let text = "server,concurrency,keepalive,rps,requests,runs,failed,unfinished_runs\n\
                    appsrv,1,0,11338,5000,1,0,0\n\
                    appsrv,256,1,,5000,1,0,1\r\n\
                    \n\
                    nginx,32,1,96080.5,5000,1,0,0\n";
        let Table::Throughput(cells) = parse_table(text).unwrap() else {
            panic!("not throughput")
        };
        assert_eq!(cells.len(), 3);
        assert_eq!(
            cells[0],
            Cell {
                server: "appsrv".into(),
                concurrency: 1,
                keep_alive: false,
                rps: Some(11338.0)
            }
        );
        assert_eq!(cells[1].rps, None);
        assert!(cells[1].keep_alive);
        assert_eq!(cells[2].rps, Some(96080.5));
    }

    #[test]
    fn rejects_bad_lines_with_their_number() {
        let text = "server,concurrency,keepalive,rps\nappsrv,1,0,100\nappsrv,x,0,100\n";
        assert_eq!(
            parse_table(text),
            Err(ParseError {
                line: 3,
                reason: "bad concurrency \"x\"".into()
            })
        );
        let text = "server,concurrency,keepalive,rps\nappsrv,1,yes,100\n";
        assert!(parse_table(text).unwrap_err().reason.contains("keepalive"));
        let text = "server,concurrency,keepalive,rps\nappsrv,1,1,-3\n";
        assert!(parse_table(text).unwrap_err().reason.contains("rps"));
    }

    #[test]
    fn parses_memory_and_skips_other_files() {
        let text = "server,phase,processes,pss_kb\nappsrv,idle,9,3100\nnginx,after,3,7390\n";
        assert_eq!(
            parse_table(text).unwrap(),
            Table::Memory(vec![
                Memory {
                    server: "appsrv".into(),
                    phase: "idle".into(),
                    processes: 9,
                    pss_kb: 3100
                },
                Memory {
                    server: "nginx".into(),
                    phase: "after".into(),
                    processes: 3,
                    pss_kb: 7390
                },
            ])
        );
        let syscalls = "server,workload,requests,syscalls_per_request,by_process,calls\n\
                        appsrv,hello-dynamic,2000,2.00,\"\",\"sendto 1.00, recvfrom 1.00\"\n";
        assert_eq!(parse_table(syscalls).unwrap(), Table::Other);
        assert_eq!(parse_table("").unwrap(), Table::Other);
    }

    #[test]
    fn splits_quoted_fields() {
        assert_eq!(
            fields(r#"a,"b, c","say ""hi""",,"#),
            vec!["a", "b, c", "say \"hi\"", "", ""]
        );
    }

    #[test]
    fn draws_both_kinds_of_chart() {
        let dir = std::env::temp_dir().join(format!("bench-charts-test-{}", std::process::id()));
        let results = dir.join("results");
        fs::create_dir_all(&results).unwrap();
        fs::write(
            results.join("hello-static.csv"),
            "server,concurrency,keepalive,rps\nappsrv,1,1,30000\nappsrv,8,1,\nappsrv,32,1,70000\n\
             nginx,1,1,10000\nnginx,32,1,90000\nappsrv,1,0,11000\nnginx,1,0,12000\n",
        )
        .unwrap();
        fs::write(
            results.join("memory.csv"),
            "server,phase,processes,pss_kb\nappsrv,idle,9,3000\nappsrv,after,33,11800\n",
        )
        .unwrap();
        fs::write(results.join("syscalls.csv"), "server,workload\nappsrv,hello\n").unwrap();
        let written = run(&results, &dir.join("charts")).unwrap();
        assert_eq!(written.len(), 2);
        let svg = fs::read_to_string(dir.join("charts/hello-static.svg")).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("nginx") && svg.contains("keep-alive"));
        let svg = fs::read_to_string(dir.join("charts/memory.svg")).unwrap();
        assert!(svg.contains("11.5 MiB, 33 p."));
        fs::remove_dir_all(&dir).unwrap();
    }
}
