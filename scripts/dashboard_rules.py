#!/usr/bin/env python3
"""Writes the Grafana dashboard's queries as Prometheus recording rules, so
`make test-alerts` can check them with promtool (`promtool check rules`)
and unit-test some (config/grafana/dashboard_test.yml).

Each query becomes the rule `dashboard:<panel id>:<refId>`, with Grafana's
variables as "All" selects them: a variable's `allValue` when it has one,
else the values its query finds (for `$job`, the jobs that report
`loopguard_messages_total`: here `loopguard`, as the tests name it),
`$__rate_interval` 1m. JSON is YAML, so no YAML library is needed.

    scripts/dashboard_rules.py config/grafana/loopguard.json > rules.yml
"""
import json
import re
import sys


def panels(items):
    """Every panel, those inside rows too."""
    for panel in items:
        yield panel
        yield from panels(panel.get("panels", []))


def main(path):
    with open(path) as f:
        dashboard = json.load(f)
    # "All" of each variable: its allValue, or what its query would find.
    found = {"job": "loopguard"}
    every = {v["name"]: v.get("allValue", found.get(v["name"]))
             for v in dashboard["templating"]["list"] if v.get("type") == "query"}
    for name, value in every.items():
        if value is None:
            sys.exit(f"variable ${name}: no allValue, and this script does not know its values")
    rules = []
    for panel in panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", "1m")
            for name, value in every.items():
                expr = expr.replace(f'"${name}"', json.dumps(value))
            if "$" in expr:
                sys.exit(f"panel {panel['title']!r}: a variable this script does not know: {expr}")
            rules.append({"record": f"dashboard:{panel['id']}:{target['refId']}", "expr": expr})
    json.dump({"groups": [{"name": "dashboard", "rules": rules}]}, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main(sys.argv[1])
