//! OpenMetrics 1.0 ([`to_openmetrics`]): the text exposition format 0.0.4, as
//! [`render_metrics`](super::render_metrics) writes it, re-framed.

use std::fmt::Write as _;

/// The units a family name may end with, which OpenMetrics declares in a `# UNIT` line.
const UNITS: [&str; 2] = ["seconds", "bytes"];

/// Re-frames the text exposition format 0.0.4, as [`render_metrics`] writes it, as
/// OpenMetrics 1.0: a counter's family is named without its samples' `_total`; a family
/// whose name ends in a unit gets a `# UNIT` line; metadata come in the order TYPE, UNIT,
/// HELP, with HELP escaped as OpenMetrics wants (`\"` too); histogram bounds (`le`) are
/// canonical numbers (`5.0`, not `5`); `untyped` is `unknown`; other comments and blank
/// lines go (OpenMetrics has none); `# EOF` ends the text. Samples are otherwise the same
/// bytes.
///
/// The OpenMetrics text is made from the 0.0.4 text rather than by a second writer so
/// that the two can never disagree on a sample, and so that `metrics --format
/// openmetrics` works against any server: the control socket's `metrics` request keeps
/// answering 0.0.4 and the client re-frames it.
pub(crate) fn to_openmetrics(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 8 + 8);
    // The HELP line waiting for its family's TYPE line.
    let mut help: Option<(&str, &str)> = None;
    // The current family: its 0.0.4 name, its OpenMetrics name and its type.
    let mut family: Option<(&str, &str, &str)> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            if let Some((name, h)) = help.take() {
                // A HELP without a TYPE: an unknown family.
                let _ = writeln!(out, "# HELP {name} {}", openmetrics_help(h));
            }
            help = Some(rest.split_once(' ').unwrap_or((rest, "")));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let kind = if kind == "untyped" { "unknown" } else { kind };
            let om = match kind {
                "counter" => name.strip_suffix("_total").unwrap_or(name),
                _ => name,
            };
            let _ = writeln!(out, "# TYPE {om} {kind}");
            if let Some(unit) = UNITS
                .iter()
                .find(|u| om.strip_suffix(*u).is_some_and(|head| head.ends_with('_')))
            {
                let _ = writeln!(out, "# UNIT {om} {unit}");
            }
            match help.take() {
                Some((h_name, h)) if h_name == name => {
                    let _ = writeln!(out, "# HELP {om} {}", openmetrics_help(h));
                }
                Some((h_name, h)) => {
                    let _ = writeln!(out, "# HELP {h_name} {}", openmetrics_help(h));
                }
                None => {}
            }
            family = Some((name, om, kind));
            continue;
        }
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some((name, h)) = help.take() {
            let _ = writeln!(out, "# HELP {name} {}", openmetrics_help(h));
        }
        let split = line.find(['{', ' ']).unwrap_or(line.len());
        let (sample, rest) = line.split_at(split);
        match family {
            // A counter's sample is `_total` in OpenMetrics, whatever 0.0.4 called it.
            Some((name, om, "counter")) if sample == name && name == om => {
                let _ = writeln!(out, "{sample}_total{rest}");
            }
            Some((_, om, "histogram")) if sample.strip_suffix("_bucket") == Some(om) => {
                out.push_str(sample);
                out.push_str(&canonical_le(rest));
                out.push('\n');
            }
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    if let Some((name, h)) = help {
        let _ = writeln!(out, "# HELP {name} {}", openmetrics_help(h));
    }
    out.push_str("# EOF\n");
    out
}

/// A 0.0.4 HELP text (`\\` and `\n` escaped) escaped for OpenMetrics (`\\`, `\n` and `\"`).
fn openmetrics_help(help: &str) -> String {
    let mut out = String::with_capacity(help.len());
    let mut chars = help.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('\\') => out.push_str("\\\\"),
                Some('n') => out.push_str("\\n"),
                // In 0.0.4 any other backslash is itself.
                Some(other) => {
                    out.push_str("\\\\");
                    if other == '"' {
                        out.push('\\');
                    }
                    out.push(other);
                }
                None => out.push_str("\\\\"),
            },
            '"' => out.push_str("\\\""),
            c => out.push(c),
        }
    }
    out
}

/// The labels and value of a histogram bucket (`{le="5"} 42`) with the `le` value as an
/// OpenMetrics canonical number (`{le="5.0"} 42`).
fn canonical_le(rest: &str) -> String {
    let start = ["{le=\"", ",le=\""]
        .iter()
        .find_map(|p| rest.find(p).map(|i| i + p.len()));
    let Some(start) = start else {
        return rest.to_owned();
    };
    let Some(len) = rest[start..].find('"') else {
        return rest.to_owned();
    };
    let value = &rest[start..start + len];
    match value.parse::<f64>() {
        Ok(v) => format!(
            "{}{}{}",
            &rest[..start],
            canonical_number(v),
            &rest[start + len..]
        ),
        // +Inf parses; anything else is left for the scraper to refuse.
        Err(_) => rest.to_owned(),
    }
}

/// A number as OpenMetrics' canonical numbers (those of Go's `strconv.FormatFloat(v, 'g',
/// -1, 64)`, with `.0` on integers): `0.0005`, `5.0`, `100000.0`, `1e+06`, `1e-05`, `+Inf`.
fn canonical_number(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    if v == 0.0 {
        return "0.0".into();
    }
    // The shortest digits that read back as `v`, and the decimal exponent.
    let sci = format!("{v:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..6).contains(&exp) {
        let plain = v.to_string();
        if plain.contains('.') {
            plain
        } else {
            format!("{plain}.0")
        }
    } else {
        format!("{mantissa}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::super::render_metrics;
    use super::*;
    use crate::control::render::tests::*;
    use crate::scoreboard::DURATION_BUCKETS_US;

    #[test]
    fn issue_17_openmetrics_reframes_the_exposition() {
        let prom = render_metrics(&event_status());
        assert!(
            !prom.contains("# EOF") && !prom.contains("# UNIT"),
            "0.0.4 has neither"
        );
        let om = to_openmetrics(&prom);
        let families = strict_openmetrics(&om);
        let family = |name: &str| {
            families
                .iter()
                .find(|f| f.0 == name)
                .unwrap_or_else(|| panic!("no family {name} in\n{om}"))
        };
        // Counters: the family without _total, its samples with it.
        let c = family("appsrv_connections");
        assert_eq!(
            (c.1.as_str(), c.3.clone()),
            ("counter", vec!["appsrv_connections_total 107".to_owned()])
        );
        assert!(om.contains("# TYPE appsrv_connections counter\n# HELP appsrv_connections Connections accepted by the workers.\n"));
        let r = family("appsrv_worker_restarts");
        assert_eq!(r.3.len(), 5);
        assert!(
            r.3[3].starts_with("appsrv_worker_restarts_total{reason=\"recycled\"} 4"),
            "{:?}",
            r.3
        );
        // Units.
        assert_eq!(family("appsrv_uptime_seconds").2.as_deref(), Some("seconds"));
        let h = family("appsrv_request_duration_seconds");
        assert_eq!((h.1.as_str(), h.2.as_deref()), ("histogram", Some("seconds")));
        assert!(om.contains(
            "# TYPE appsrv_request_duration_seconds histogram\n# UNIT appsrv_request_duration_seconds seconds\n# HELP "
        ));
        let units: Vec<&str> = families
            .iter()
            .filter(|f| f.2.is_some())
            .map(|f| f.0.as_str())
            .collect();
        assert_eq!(
            units,
            ["appsrv_request_duration_seconds", "appsrv_uptime_seconds"]
        );
        // Canonical bounds; otherwise the samples are the same bytes.
        assert!(h.3.contains(&"appsrv_request_duration_seconds_bucket{le=\"0.0005\"} 15".to_owned()));
        assert!(h.3.contains(&"appsrv_request_duration_seconds_bucket{le=\"5.0\"} 420".to_owned()));
        assert!(h.3.contains(&"appsrv_request_duration_seconds_bucket{le=\"1.0\"} 420".to_owned()));
        let prom_samples: Vec<String> = prom
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| {
                l.replace("{le=\"5\"}", "{le=\"5.0\"}")
                    .replace("{le=\"1\"}", "{le=\"1.0\"}")
            })
            .collect();
        let om_samples: Vec<String> = families.iter().flat_map(|f| f.3.clone()).collect();
        assert_eq!(prom_samples, om_samples);
        // Every family of the 0.0.4 text is there, with its help.
        assert_eq!(
            families.len(),
            prom.lines().filter(|l| l.starts_with("# TYPE ")).count()
        );
        assert_eq!(om.matches("# HELP ").count(), families.len());
    }

    #[test]
    fn issue_17_openmetrics_escapes_help_and_frames_any_family() {
        let text = "# HELP a_total Says \"hi\" \\\\ back\\nslash \\x.\n# TYPE a_total counter\na_total 1\n\
                    # HELP b A bare one.\n# TYPE b counter\nb{x=\"1\"} 2\n\
                    # HELP c_bytes Sizes.\n# TYPE c_bytes gauge\nc_bytes 3\n\
                    # A comment.\n\n# TYPE d untyped\nd 4\n# HELP e_nounit_seconds_x Last.\n";
        let om = to_openmetrics(text);
        assert_eq!(
            om,
            "# TYPE a counter\n# HELP a Says \\\"hi\\\" \\\\ back\\nslash \\\\x.\na_total 1\n\
             # TYPE b counter\n# HELP b A bare one.\nb_total{x=\"1\"} 2\n\
             # TYPE c_bytes gauge\n# UNIT c_bytes bytes\n# HELP c_bytes Sizes.\nc_bytes 3\n\
             # TYPE d unknown\nd 4\n# HELP e_nounit_seconds_x Last.\n# EOF\n"
        );
        assert_eq!(to_openmetrics(""), "# EOF\n");
    }

    #[test]
    fn canonical_numbers_are_those_of_openmetrics() {
        for (v, want) in [
            (0.0005, "0.0005"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (0.0025, "0.0025"),
            (1.0, "1.0"),
            (5.0, "5.0"),
            (1.7, "1.7"),
            (100_000.0, "100000.0"),
            (1e6, "1e+06"),
            (1.1e23, "1.1e+23"),
            (0.0, "0.0"),
            (f64::INFINITY, "+Inf"),
        ] {
            assert_eq!(canonical_number(v), want, "{v}");
        }
        // Every bound of the duration histogram as Python's prometheus_client writes it.
        let bounds: Vec<String> = DURATION_BUCKETS_US
            .iter()
            .map(|us| canonical_number(*us as f64 / 1e6))
            .collect();
        assert_eq!(
            bounds,
            [
                "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0",
                "5.0"
            ]
        );
    }
}
