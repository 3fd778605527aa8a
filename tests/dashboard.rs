//! The Grafana dashboard and the alert rules only query metrics loopguard
//! exports (contract §8), so a rename cannot silently blank a panel or mute
//! an alert.

use std::collections::BTreeSet;

/// Metric names loopguard exports (its own and the process collector's),
/// plus Prometheus' own `up`.
const KNOWN: &[&str] = &[
    "loopguard_messages_total",
    "loopguard_suppressed_total",
    "loopguard_would_suppress_total",
    "loopguard_handoffs_total",
    "loopguard_deliveries_total",
    "loopguard_decision_duration_seconds_bucket",
    "loopguard_worlds",
    "loopguard_nats_connected",
    "loopguard_nats_reconnects_total",
    "loopguard_ready",
    "loopguard_dropped_total",
    "loopguard_config_reloads_total",
    "loopguard_worlds_by_state",
    "process_cpu_seconds_total",
    "up",
];

/// Every `loopguard_*`, `process_*` or `up` identifier in a PromQL expression.
fn metric_names(expr: &str) -> BTreeSet<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("loopguard_") || w.starts_with("process_") || *w == "up")
        .map(str::to_string)
        .collect()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))).expect(path)
}

#[test]
fn dashboard_panels_query_only_exported_metrics_and_cover_the_essentials() {
    let dash: serde_json::Value =
        serde_json::from_str(&read("config/grafana/loopguard.json")).unwrap();
    let mut used = BTreeSet::new();
    let mut titles = Vec::new();
    for panel in dash["panels"].as_array().unwrap() {
        titles.push(panel["title"].as_str().unwrap().to_string());
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            for name in metric_names(expr) {
                assert!(
                    KNOWN.contains(&name.as_str()),
                    "panel {:?} queries unknown {name}",
                    panel["title"]
                );
                used.insert(name);
            }
        }
    }
    for needed in [
        "loopguard_messages_total",
        "loopguard_suppressed_total",
        "loopguard_handoffs_total",
        "loopguard_decision_duration_seconds_bucket",
        "loopguard_worlds",
        "loopguard_nats_connected",
    ] {
        assert!(used.contains(needed), "no panel shows {needed}: {titles:?}");
    }
}

#[test]
fn alert_expressions_query_only_exported_metrics() {
    let alerts = read("config/prometheus/alerts.yml");
    let exprs: Vec<&str> = alerts
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr:"))
        .collect();
    assert!(exprs.len() >= 7, "{exprs:?}");
    for expr in exprs {
        for name in metric_names(expr) {
            assert!(
                KNOWN.contains(&name.as_str()),
                "alert queries unknown {name}: {expr}"
            );
        }
    }
}
