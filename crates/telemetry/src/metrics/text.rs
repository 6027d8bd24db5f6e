//! Prometheus' text format (0.0.4) from the OpenMetrics text that `prometheus-client`
//! writes (it writes nothing else yet: prometheus/client_rust#51). The samples are the same;
//! what differs is the families' names in `# HELP` and `# TYPE` (a counter's carries
//! `_total` there, as its samples do), types OpenMetrics has and 0.0.4 lacks, and the lines
//! 0.0.4 does not know (`# UNIT`, `# EOF`).

use std::collections::HashSet;

/// The 0.0.4 text of `openmetrics`.
pub(super) fn from_openmetrics(openmetrics: &str) -> String {
    let counters: HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut text = String::with_capacity(openmetrics.len() + 16 * counters.len());
    for line in openmetrics.lines() {
        let out = if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            format!("# HELP {} {help}", family(name, &counters))
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            let kind = match kind {
                "counter" | "gauge" | "histogram" | "summary" => kind,
                "info" | "stateset" => "gauge",
                _ => "untyped",
            };
            format!("# TYPE {} {kind}", family(name, &counters))
        } else if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        } else {
            line.to_owned()
        };
        text.push_str(&out);
        text.push('\n');
    }
    text
}

/// A family's name as 0.0.4 spells it: a counter's with `_total`.
fn family(name: &str, counters: &HashSet<&str>) -> String {
    if counters.contains(name) {
        format!("{name}_total")
    } else {
        name.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_named_as_their_samples_and_openmetrics_lines_go() {
        let om = "# HELP cyphonic_things Things seen.\n# TYPE cyphonic_things counter\ncyphonic_things_total 7\n# HELP cyphonic_level A level.\n# TYPE cyphonic_level gauge\n# UNIT cyphonic_level seconds\ncyphonic_level 2.5\n# HELP cyphonic_hold_seconds Hold.\n# TYPE cyphonic_hold_seconds histogram\ncyphonic_hold_seconds_bucket{le=\"+Inf\"} 3\ncyphonic_hold_seconds_sum 0.5\ncyphonic_hold_seconds_count 3\n# TYPE cyphonic_odd unknown\n# EOF\n";
        assert_eq!(
            from_openmetrics(om),
            "# HELP cyphonic_things_total Things seen.\n# TYPE cyphonic_things_total counter\ncyphonic_things_total 7\n# HELP cyphonic_level A level.\n# TYPE cyphonic_level gauge\ncyphonic_level 2.5\n# HELP cyphonic_hold_seconds Hold.\n# TYPE cyphonic_hold_seconds histogram\ncyphonic_hold_seconds_bucket{le=\"+Inf\"} 3\ncyphonic_hold_seconds_sum 0.5\ncyphonic_hold_seconds_count 3\n# TYPE cyphonic_odd untyped\n"
        );
    }
}
