"""Write deploy/k8s/base/prometheusrule.yaml from deploy/prometheus/alerts.yml: one set of alerts, two homes.

``python deploy/k8s/render_prometheusrule.py`` after editing alerts.yml (tests/deploy/test_k8s.py fails until
then). A PrometheusRule's ``spec`` has the same ``groups`` as a Prometheus rule file, so the rules go in as
text, indented under ``spec:``, comments and all; nothing is parsed or re-serialised.
"""

from __future__ import annotations

import sys
from pathlib import Path

DEPLOY = Path(__file__).resolve().parents[1]
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
TARGET = DEPLOY / "k8s" / "base" / "prometheusrule.yaml"

HEADER = """\
# Generated from deploy/prometheus/alerts.yml by deploy/k8s/render_prometheusrule.py: edit that file, then
# run this script. The thresholds' reasoning is in alerts.yml's header.
# Your Prometheus selects PrometheusRules by label (kube-prometheus-stack: `release: <its release name>`):
# add that label here if it needs one.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: dbf-serve
  labels:
    app.kubernetes.io/name: dbf-serve
spec:
"""


def render(alerts: str) -> str:
    """The PrometheusRule for the rule file's text ``alerts`` (its leading comment block left out)."""
    lines = alerts.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("groups:"))
    body = "".join(f"  {line}\n" if line else "\n" for line in lines[start:])
    return HEADER + body


def main() -> int:
    TARGET.write_text(render(ALERTS.read_text()))
    print(f"wrote {TARGET.relative_to(DEPLOY.parent)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
