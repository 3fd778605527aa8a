//! The Grafana dashboard and the alert rules only query metrics loopguard
//! exports (contract §8), so a rename cannot silently blank a panel or mute
//! an alert.

use std::collections::BTreeSet;

/// Metric names loopguard exports (its own and the process collector's),
/// as a fresh registry lists them: a histogram as its `_bucket`, `_sum`
/// and `_count` series. Taken from the code, so a rename there shows here.
fn exported() -> BTreeSet<String> {
    let metrics = loopguard::metrics::Metrics::new();
    // Shown only once read (JetStream mode).
    metrics.consumer_counts("INGEST", "loopguard").set(0, 0);
    let text = String::from_utf8(metrics.encode()).unwrap();
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').unwrap();
        if kind == "histogram" {
            for suffix in ["_bucket", "_sum", "_count"] {
                names.insert(format!("{name}{suffix}"));
            }
        } else {
            names.insert(name.to_string());
        }
    }
    // Prometheus' own.
    names.insert("up".into());
    names
}

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
    let known = exported();
    let mut used = BTreeSet::new();
    let mut titles = Vec::new();
    for panel in dash["panels"].as_array().unwrap() {
        titles.push(panel["title"].as_str().unwrap().to_string());
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            // The alerts name one instance: every panel can show just it.
            assert!(
                expr.contains(r#"namespace=~"$namespace", instance=~"$instance""#),
                "panel {:?} is not filtered by namespace and instance: {expr}",
                panel["title"]
            );
            for name in metric_names(expr) {
                assert!(
                    known.contains(&name),
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
        "loopguard_state_bytes",
        "loopguard_policy_requests_total",
        "loopguard_config_reloads_total",
        "loopguard_world_evictions_total",
        "loopguard_jetstream_pending",
        "loopguard_jetstream_ack_pending",
    ] {
        assert!(used.contains(needed), "no panel shows {needed}: {titles:?}");
    }
}

/// The `expr:` of each rule in an alerts file, written on its line or as
/// a block (`expr: |` and the lines indented under it).
fn alert_exprs(yaml: &str) -> Vec<String> {
    let mut exprs = Vec::new();
    let mut lines = yaml.lines().peekable();
    while let Some(line) = lines.next() {
        let Some(expr) = line.trim_start().strip_prefix("expr:") else {
            continue;
        };
        let expr = expr.trim();
        if !matches!(expr, "|" | "|-" | ">" | ">-") {
            exprs.push(expr.to_string());
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        let mut block = Vec::new();
        while let Some(next) =
            lines.next_if(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > indent)
        {
            block.push(next.trim());
        }
        exprs.push(block.join(" ").trim().to_string());
    }
    exprs
}

#[test]
fn alert_expressions_query_only_exported_metrics() {
    let known = exported();
    let exprs = alert_exprs(&read("config/prometheus/alerts.yml"));
    assert_eq!(exprs.len(), 15, "{exprs:#?}");
    for expr in &exprs {
        assert!(!expr.is_empty(), "{exprs:#?}");
        for name in metric_names(expr) {
            assert!(
                known.contains(&name),
                "alert queries unknown {name}: {expr}"
            );
        }
    }
    // The block expression is read too.
    assert!(
        exprs
            .iter()
            .any(|e| e.contains("loopguard_policy_requests_total")),
        "{exprs:#?}"
    );
}
