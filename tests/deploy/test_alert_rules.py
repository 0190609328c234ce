"""The monitoring configuration, checked by the tools that load it (promtool, amtool) and against the service:
the rules' unit tests pass, and rules and dashboard ask for metrics and error reasons the service has."""

from __future__ import annotations

import json
import re

import yaml
from prometheus_client.metrics import MetricWrapperBase

from service import errors, metrics
from tests.deploy.conftest import (
    ALERTMANAGER_CONFIG,
    ALERTS,
    DEPLOY,
    PROMETHEUS_CONFIG,
    load_yaml,
    require_tool,
    run_tool,
)

DASHBOARD = DEPLOY / "grafana" / "dashboards" / "dbf-serve.json"
DATASOURCES = DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
# Error reasons no alert looks at: stray paths and methods (scanners, typos), other HTTP errors, clients
# that hang up or stall before sending their whole body (their network, not their integration: a stalled
# upload costs a connection for DBF_BODY_TIMEOUT_SECONDS, never a predict slot), and refused reloads
# (DBFModelReloadFailed watches dbf_model_reloads_total, which counts the directory watcher's refusals too),
# and admin calls from other hosts to a service without a key (an operator's mistake, answered at once).
UNALERTED_REASONS = {
    "forbidden",
    "not_found",
    "method_not_allowed",
    "http_error",
    "client_disconnected",
    "request_timeout",
    "reload_failed",
}
# Refused at the connection level (service/server.py): scanners, floods and broken networks more than broken
# integrations, and a deploy's shutdown; dbf_errors_total and dbf_connections_shed_total show them.
UNALERTED_REASONS |= {
    "malformed_request",
    "headers_too_large",
    "uri_too_long",
    "header_timeout",
    "shutting_down",
}


def exposed_names() -> set[str]:
    """Every series name the service exposes (counters end in _total, histograms in _bucket/_sum/_count)."""
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}
    return {
        family._name + suffix
        for family in vars(metrics).values()
        if isinstance(family, MetricWrapperBase)
        for suffix in suffixes[family._type]
    }


def rule_expressions() -> list[str]:
    return [rule["expr"] for group in load_yaml(ALERTS)["groups"] for rule in group["rules"]]


def dashboard_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def test_prometheus_config_and_its_rules_load():
    promtool = require_tool("promtool", package="prometheus")
    out = run_tool(promtool, "check", "config", PROMETHEUS_CONFIG).stdout
    assert "alerts.yml" in out  # the config loads the rule file the tests below test
    run_tool(promtool, "check", "rules", ALERTS)


def test_alert_rules_unit_tests():
    promtool = require_tool("promtool", package="prometheus")
    tests = DEPLOY / "prometheus" / "alerts.test.yml"
    assert load_yaml(tests)["rule_files"] == ["alerts.yml"]
    run_tool(promtool, "test", "rules", tests)


def test_every_alert_has_a_test_that_fires_it_and_one_that_does_not():
    tested: dict[str, set[bool]] = {}
    for case in load_yaml(DEPLOY / "prometheus" / "alerts.test.yml")["tests"]:
        for check in case["alert_rule_test"]:
            tested.setdefault(check["alertname"], set()).add(bool(check["exp_alerts"]))
    alerts = {rule["alert"] for group in load_yaml(ALERTS)["groups"] for rule in group["rules"]}
    assert set(tested) == alerts
    assert all(outcomes == {True, False} for outcomes in tested.values()), tested


def test_alertmanager_config_loads():
    amtool = require_tool("amtool", package="prometheus-alertmanager")
    run_tool(amtool, "check-config", ALERTMANAGER_CONFIG)


def test_rules_and_dashboard_ask_for_metrics_the_service_exposes():
    exposed = exposed_names()
    for expr in rule_expressions() + dashboard_expressions():
        asked = set(re.findall(r"\bdbf_[a-z_]+", expr))
        assert asked or "up{" in expr, expr
        assert asked <= exposed, f"{sorted(asked - exposed)} in {expr!r}: not in service/metrics.py"


def test_every_error_reason_is_classified():
    """Each reason the service counts is looked at by an alert or knowingly left out: a new reason (say, a new
    kind of refusal) needs a decision here, and a typo in a rule matches nothing and fails."""
    used: set[str] = set()
    for expr in rule_expressions():
        for matcher in re.findall(r'reason=~?"([^"]+)"', expr):
            used.update(matcher.split("|"))
    reasons = set(errors.REASONS)
    assert used <= reasons, sorted(used - reasons)
    assert used | UNALERTED_REASONS == reasons, f"no decision on {sorted(reasons - used - UNALERTED_REASONS)}"
    # Load shedding is a capacity matter, never a server error.
    rules = [rule for group in load_yaml(ALERTS)["groups"] for rule in group["rules"]]
    server = next(rule for rule in rules if rule["alert"] == "DBFServerErrors")
    assert re.findall(r'reason=~?"([^"]+)"', server["expr"]) == ["internal_error", "internal_error"]


def test_conflict_thresholds_are_multiples_of_the_calibrated_rate():
    """Of a rate above 0: a model removed by a reload under --workers N reads 0 (alerts.test.yml, "a model a
    hot reload removed"), and a threshold of 0 fired on any flag."""
    rules = [r for g in load_yaml(ALERTS)["groups"] for r in g["rules"]]
    conflict = [r for r in rules if r["alert"] in {"DBFHighConflictRate", "DBFModalityConflict"}]
    assert len(conflict) == 3
    for rule in conflict:
        assert re.search(r"\d \* max by \(namespace, job, model\) \(dbf_flag_clean_rate > 0\)", rule["expr"])
        assert "increase(dbf_predictions_total[10m])) >= 500" in rule["expr"]  # the traffic floor
        assert "rate(dbf_predictions_total[10m])) > 0)" in rule["expr"]  # no division by zero
        assert rule["for"]


def test_dashboard_queries_parse(tmp_path):
    """Every dashboard query is valid PromQL (checked by promtool as a recording rule), and the dashboard
    uses the data source that Grafana is provisioned with."""
    promtool = require_tool("promtool", package="prometheus")
    dashboard = json.loads(DASHBOARD.read_text())
    uid = load_yaml(DATASOURCES)["datasources"][0]["uid"]
    assert {panel["datasource"]["uid"] for panel in dashboard["panels"]} == {uid}
    expressions = dashboard_expressions() + [a["expr"] for a in dashboard["annotations"]["list"]]
    grafana_variables = {"$model": ".+", "$__rate_interval": "1m"}
    records = []
    for i, expr in enumerate(expressions):
        for variable, value in grafana_variables.items():
            expr = expr.replace(variable, value)
        records.append({"record": f"dashboard:query_{i}", "expr": expr})
    rules = tmp_path / "dashboard-queries.yml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]}))
    run_tool(promtool, "check", "rules", rules)
