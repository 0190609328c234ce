"""End to end: a real Prometheus (and Alertmanager) scraping the real service on loopback, with the rules of
deploy/prometheus/alerts.yml. Clean traffic raises no conflict or view alert; then one view of every sample is
swapped for that view of a sample of another class, and the conflict alerts go pending, then firing, the
modality alert and the view agreement alert naming that view.

Only time is scaled down: scrapes and evaluations every second, `for:` durations of 3 s and rate windows of
20 s instead of minutes. Thresholds, the traffic floor and every expression are those of alerts.yml.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from fusion import METHODS
from tests.deploy.conftest import (
    ALERTMANAGER_CONFIG,
    ALERTS,
    PROMETHEUS_CONFIG,
    REPO,
    load_yaml,
    require_tool,
    stop,
)
from tests.service.conftest import free_port, running_service
from training.readers import load

pytestmark = pytest.mark.data

MODEL = "handwritten"
TAMPERED_VIEW = "fac"  # its conflicts are blamed on it reliably (pix and kar would do as well)
SAMPLES_PER_REQUEST = 250  # ~3 MB of JSON, under the service's body limit
WINDOW = "20s"
FOR = "3s"
CONFLICT_ALERTS = {"DBFHighConflictRate", "DBFModalityConflict"}
VIEW_ALERTS = {"DBFViewOutOfRange", "DBFViewMissing", "DBFViewDisagreement"}


def scaled_rules(path: Path) -> dict:
    """alerts.yml with rate windows of WINDOW and `for:` of FOR; all else as it is."""
    rules = load_yaml(path)
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule["expr"] = re.sub(r"\[\d+[mh]\]", f"[{WINDOW}]", rule["expr"])
            if "for" in rule:
                rule["for"] = FOR
    return rules


def prometheus_config(rules: Path, target: str, alertmanager: str) -> dict:
    """deploy/prometheus/prometheus.yml pointed at loopback, scraping and evaluating every second."""
    config = load_yaml(PROMETHEUS_CONFIG)
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(rules)]
    config["alerting"]["alertmanagers"][0]["static_configs"] = [{"targets": [alertmanager]}]
    (job,) = [job for job in config["scrape_configs"] if job["job_name"] == "dbf-serve"]
    job["static_configs"] = [{"targets": [target]}]
    config["scrape_configs"] = [job]
    return config


@contextmanager
def server(command: list[str], ready_url: str, log: Path, timeout: float = 30) -> Iterator[None]:
    """Run ``command`` until the block ends, once ``ready_url`` answers 200; its output goes to ``log``."""
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{command[0]} exited with {process.returncode}:\n{log.read_text()}")
            try:
                if httpx.get(ready_url, timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{command[0]} not ready within {timeout} s:\n{log.read_text()}")
            time.sleep(0.1)
        yield
    finally:
        stop(process)


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str) -> float | None:
        result = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=5).json()
        assert result["status"] == "success", result
        values = result["data"]["result"]
        return float(values[0]["value"][1]) if values else None

    def alerts(self) -> list[dict]:
        """Active alerts (pending or firing) on the test's model."""
        active = httpx.get(f"{self.url}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
        return [a for a in active if a["labels"].get("model", MODEL) == MODEL]

    def wait_for(self, expr: str, what: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while (value := self.query(expr)) is None or value == 0:
            assert time.monotonic() < deadline, f"Prometheus never saw {what} ({expr} = {value})"
            time.sleep(0.25)


def bodies(data, rng: np.random.Generator, tamper: str | None, count: int) -> list[bytes]:
    """``count`` request bodies of SAMPLES_PER_REQUEST samples; with ``tamper``, that view of every sample is
    that view of a sample of the next class, as in the paper's conflictive test sets."""
    views, classes = list(data.views), int(data.labels.max()) + 1
    out = []
    for _ in range(count):
        samples = []
        for i in rng.choice(len(data.labels), size=SAMPLES_PER_REQUEST, replace=False):
            sample = {v: data.views[v][i].tolist() for v in views}
            if tamper:
                donor = rng.choice(np.flatnonzero(data.labels == (data.labels[i] + 1) % classes))
                sample[tamper] = data.views[tamper][donor].tolist()
            samples.append({"views": sample})
        out.append(json.dumps({"samples": samples}).encode())
    return out


def fused_with(body: bytes, method: str) -> bytes:
    """``body`` asking for fusion ``method``."""
    return json.dumps({**json.loads(body), "method": method}).encode()


def altered(body: bytes, change: Callable[[dict], None]) -> bytes:
    """``body`` with ``change`` made to each sample's views."""
    request = json.loads(body)
    for sample in request["samples"]:
        change(sample["views"])
    return json.dumps(request).encode()


def rescaled(view: str) -> Callable[[dict], None]:
    """That view's features in another unit (x1000): far outside its training range."""
    return lambda views: views.update({view: [1000.0 * x for x in views[view]]})


def dropped(view: str) -> Callable[[dict], None]:
    """That view no longer sent."""
    return lambda views: views.pop(view)


def test_conflict_and_view_alerts_fire_on_real_traffic_and_name_the_view(data_dir, tmp_path):
    prometheus_bin = require_tool("prometheus", package="prometheus")
    # Debian names the binary prometheus-alertmanager.
    alertmanager_bin = require_tool(
        "alertmanager", "prometheus-alertmanager", package="prometheus-alertmanager"
    )
    data = load(MODEL, data_dir)
    rng = np.random.default_rng(0)
    # Clean traffic asks for every fusion method, as clients may: the view alerts count a view sent whatever
    # the method (DBFViewMissing once took every view of bcf's traffic as not sent).
    clean = [
        fused_with(body, m) for body, m in zip(bodies(data, rng, None, len(METHODS)), METHODS, strict=True)
    ]
    conflictive = bodies(data, rng, TAMPERED_VIEW, 4)

    rules = tmp_path / "alerts.yml"
    rules.write_text(yaml.safe_dump(scaled_rules(ALERTS), sort_keys=False))
    am_port, prom_port = free_port(), free_port()
    am_url, prom_url = f"http://127.0.0.1:{am_port}", f"http://127.0.0.1:{prom_port}"
    alertmanager = [
        alertmanager_bin,
        f"--config.file={ALERTMANAGER_CONFIG}",  # as committed
        f"--storage.path={tmp_path / 'alertmanager'}",
        f"--web.listen-address=127.0.0.1:{am_port}",
        "--cluster.listen-address=",  # no gossip port: one instance
    ]
    with (
        running_service("--model-dir", str(REPO / "models")) as service,
        server(alertmanager, f"{am_url}/-/ready", tmp_path / "alertmanager.log"),
    ):
        config = tmp_path / "prometheus.yml"
        target = service.removeprefix("http://")
        config.write_text(yaml.safe_dump(prometheus_config(rules, target, f"127.0.0.1:{am_port}")))
        prometheus = [
            prometheus_bin,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'prometheus'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ]
        with server(prometheus, f"{prom_url}/-/ready", tmp_path / "prometheus.log"):
            prom = Prometheus(prom_url)
            prom.wait_for('up{job="dbf-serve"}', "the service up")

            def send(body: bytes) -> None:
                response = httpx.post(
                    f"{service}/v1/models/{MODEL}/predict",
                    content=body,
                    headers={"content-type": "application/json"},
                    timeout=60,
                )
                assert response.status_code == 200, response.text

            # Clean traffic, above the traffic floor for a whole window: no conflict alert, ever.
            floor_met = (
                f'sum(increase(dbf_predictions_total{{model="{MODEL}"}}[{WINDOW}])) >= 500 '
                f'and sum(rate(dbf_predictions_total{{model="{MODEL}"}}[{WINDOW}])) > 0'
            )
            seen_clean: list[dict] = []
            deadline = time.monotonic() + 60
            i = 0
            while prom.query(floor_met) is None:
                assert time.monotonic() < deadline, "Prometheus never saw the clean traffic's floor"
                send(clean[i % len(clean)])
                i += 1
                seen_clean += prom.alerts()
            for _ in range(8):  # a few evaluations more over clean traffic, with the floor met
                send(clean[i % len(clean)])
                i += 1
                seen_clean += prom.alerts()
                time.sleep(0.25)
            clean_rate = prom.query(
                f'sum(rate(dbf_high_conflict_total{{model="{MODEL}"}}[{WINDOW}])) '
                f'/ sum(rate(dbf_predictions_total{{model="{MODEL}"}}[{WINDOW}]))'
            )
            assert clean_rate is not None and clean_rate < 0.05, clean_rate
            assert not [a for a in seen_clean if a["labels"]["alertname"] in CONFLICT_ALERTS | VIEW_ALERTS]

            # One view tampered with in every sample.
            states: dict[tuple[str, str, str], list[str]] = {}
            wanted = {
                ("DBFHighConflictRate", "warning", ""),
                ("DBFHighConflictRate", "critical", ""),
                ("DBFModalityConflict", "warning", TAMPERED_VIEW),
                ("DBFViewDisagreement", "warning", TAMPERED_VIEW),  # another class's: seldom the others'
            }
            deadline = time.monotonic() + 90
            while not all(states.get(key, [""])[-1] == "firing" for key in wanted):
                assert time.monotonic() < deadline, f"not all of {wanted} fired; seen: {states}"
                send(conflictive[i % len(conflictive)])
                i += 1
                for alert in prom.alerts():
                    labels = alert["labels"]
                    key = (labels["alertname"], labels.get("severity", ""), labels.get("view", ""))
                    if states.get(key, [""])[-1] != alert["state"]:
                        states.setdefault(key, []).append(alert["state"])
            for key in wanted:
                assert states[key][:1] == ["pending"] and "firing" in states[key], (key, states[key])
            # The modality and agreement alerts name the tampered view and no other; nothing else fired.
            for alert in ("DBFModalityConflict", "DBFViewDisagreement"):
                assert {view for name, _, view in states if name == alert} == {TAMPERED_VIEW}, states
            assert {name for name, _, _ in states} == CONFLICT_ALERTS | {"DBFViewDisagreement"}, states

            # Prometheus hands the firing alerts to Alertmanager (the committed configuration).
            deadline = time.monotonic() + 30
            while True:
                received = httpx.get(f"{am_url}/api/v2/alerts", timeout=5).json()
                names = {(a["labels"]["alertname"], a["labels"].get("view", "")) for a in received}
                if {("DBFHighConflictRate", ""), ("DBFModalityConflict", TAMPERED_VIEW)} <= names:
                    break
                assert time.monotonic() < deadline, f"Alertmanager has {names}"
                time.sleep(0.25)

            # A view in another unit, then a view no longer sent: each is fused as missing, which the flag
            # cannot see; the view alerts fire, naming it.
            for name, view, change in (
                ("DBFViewOutOfRange", "mor", rescaled("mor")),
                ("DBFViewMissing", "zer", dropped("zer")),
            ):
                broken = [altered(body, change) for body in clean]
                deadline = time.monotonic() + 90
                while not any(
                    (a["labels"]["alertname"], a["labels"].get("view"), a["state"]) == (name, view, "firing")
                    for a in prom.alerts()
                ):
                    assert time.monotonic() < deadline, f"{name} never fired for {view}: {prom.alerts()}"
                    send(broken[i % len(broken)])
                    i += 1
                named = {a["labels"].get("view") for a in prom.alerts() if a["labels"]["alertname"] == name}
                assert named == {view}, named
