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
    selectors(expr).into_iter().map(|(name, _)| name).collect()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))).expect(path)
}

/// Every panel, those inside rows too.
fn panels(items: &serde_json::Value) -> Vec<&serde_json::Value> {
    let mut all = Vec::new();
    for panel in items.as_array().unwrap() {
        all.push(panel);
        if panel.get("panels").is_some() {
            all.extend(panels(&panel["panels"]));
        }
    }
    all
}

/// Each metric selector of `expr` (a `loopguard_*`, `process_*` or `up`
/// name) and what its braces hold, `None` for a bare name.
fn selectors(expr: &str) -> Vec<(String, Option<String>)> {
    let mut found = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
        if !word(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && word(bytes[i]) {
            i += 1;
        }
        let name = &expr[start..i];
        if !(name.starts_with("loopguard_") || name.starts_with("process_") || name == "up") {
            continue;
        }
        let braces = expr[i..]
            .strip_prefix('{')
            .and_then(|rest| rest.split_once('}'))
            .map(|(inside, _)| inside.to_string());
        found.push((name.to_string(), braces));
    }
    found
}

#[test]
fn dashboard_panels_query_only_exported_metrics_and_cover_the_essentials() {
    let dash: serde_json::Value =
        serde_json::from_str(&read("config/grafana/loopguard.json")).unwrap();
    let known = exported();
    let mut used = BTreeSet::new();
    let mut titles = Vec::new();
    for panel in panels(&dash["panels"]) {
        titles.push(panel["title"].as_str().unwrap().to_string());
        let Some(targets) = panel["targets"].as_array() else {
            continue; // a row
        };
        for target in targets {
            let expr = target["expr"].as_str().unwrap();
            // The alerts name one instance: every selector of every panel
            // can show just it (a query with one selector left unfiltered
            // would mix in every instance).
            for (name, braces) in selectors(expr) {
                let filter = r#"job=~"$job", namespace=~"$namespace", instance=~"$instance""#;
                assert!(
                    braces.is_some_and(|b| b.contains(filter)),
                    "panel {:?}: {name} is not filtered by job, namespace and instance: {expr}",
                    panel["title"]
                );
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
        "loopguard_handoffs_total",
        "loopguard_decision_duration_seconds_bucket",
        "loopguard_worlds",
        "loopguard_state_bytes",
        "loopguard_world_evictions_total",
        "loopguard_policy_duration_seconds_bucket",
    ] {
        assert!(used.contains(needed), "no panel shows {needed}: {titles:?}");
    }
    // What each alert fires on has a panel to look at when it pages.
    for expr in alert_exprs(&read("config/prometheus/alerts.yml")) {
        for name in metric_names(&expr) {
            assert!(
                used.contains(&name),
                "no panel shows {name}, which an alert reads: {expr}"
            );
        }
    }
}

/// "All" jobs are the jobs that report loopguard's metrics, not every job:
/// an `allValue` of `.*` would let `up` and `process_*` take in every target
/// Prometheus scrapes (the stats would read down for any other job's).
/// scripts/dashboard_rules.py tests the queries so.
#[test]
fn all_jobs_are_loopguard_s_jobs() {
    let dash: serde_json::Value =
        serde_json::from_str(&read("config/grafana/loopguard.json")).unwrap();
    let vars = dash["templating"]["list"].as_array().unwrap();
    let job = vars.iter().find(|v| v["name"] == "job").unwrap();
    assert!(job["allValue"].is_null(), "{job}");
    assert!(
        job["query"].as_str().unwrap().contains("loopguard_"),
        "{job}"
    );
    assert_eq!(job["refresh"], 2, "its values loaded with the dashboard");
}

#[test]
fn selectors_are_found_with_their_braces() {
    let expr = r#"sum(rate(loopguard_a_total{x="1"}[5m])) / up or process_b{}"#;
    assert_eq!(
        selectors(expr),
        [
            (
                "loopguard_a_total".to_string(),
                Some(r#"x="1""#.to_string())
            ),
            ("up".to_string(), None),
            ("process_b".to_string(), Some(String::new())),
        ]
    );
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
