"""The docs site builds as CI builds it, ``mkdocs build --strict`` (a broken link, a missing anchor or
reference, a page left out of the navigation fails), and its generated pages hold what the code defines
today: every setting, route, alert and metric, found by the site's search where a reader would look."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from docs import generate
from service.settings import Settings
from tests.docs.examples import ROOT


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, f"mkdocs build --strict failed:\n{built.stdout}\n{built.stderr}"
    return out


def _page(site: Path, name: str) -> str:
    return (site / name / "index.html").read_text()


def _search(site: Path, term: str) -> list[str]:
    """The pages (and sections) whose text the site's search finds ``term`` in."""
    index = json.loads((site / "search" / "search_index.json").read_text())
    return [doc["location"] for doc in index["docs"] if term in doc["text"] or term in doc["title"]]


def test_every_setting_is_in_the_configuration_reference(site):
    page = _page(site, "operations/configuration")
    prefix = Settings.model_config["env_prefix"]
    missing = [
        f"{prefix}{name.upper()}" for name in Settings.model_fields if f"{prefix}{name.upper()}" not in page
    ]
    assert not missing


def test_every_setting_says_what_it_sets():
    """The configuration reference is generated from the fields' descriptions: DBF_DEVICE had none, a blank
    cell where the reader looks for auto, cuda and cpu."""
    rows = generate.settings_table().splitlines()[2:]
    blank = [row.split(" | ")[0].strip("| `") for row in rows if row.endswith("|  |")]
    assert not blank


def test_every_route_is_in_the_openapi_reference(site):
    schema = json.loads((site / "api" / "openapi.json").read_text())
    assert schema == json.loads(json.dumps(generate.openapi_schema()))
    page = _page(site, "api/openapi")
    for path, operations in schema["paths"].items():
        for method in operations:
            assert f"{method.upper()} {path}" in page


def test_every_alert_is_in_the_runbook(site):
    rules = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())
    alerts = {rule["alert"] for group in rules["groups"] for rule in group["rules"] if "alert" in rule}
    page = _page(site, "operations/alerts")
    assert alerts and all(alert in page for alert in alerts)


def test_every_metric_is_in_the_metrics_list(site):
    """Every metric ``service.metrics`` defines (the generator reads the registry instead)."""
    from prometheus_client.metrics import MetricWrapperBase

    from service import metrics

    defined = [m.describe()[0].name for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)]
    page = _page(site, "operations/metrics")
    assert defined and all(name in page for name in defined)


@pytest.mark.parametrize(
    ("term", "where"),
    [
        ("discount", "uncertainty/#discount"),
        ("DBF_MAX_BODY_BYTES", "operations/configuration/"),
        ("DBF_MAX_BODY_BYTES", "operations/limits/#connections-and-bodies"),
        ("DBFModalityConflict", "operations/alerts/#dbfmodalityconflict"),
    ],
)
def test_search_finds_what_a_newcomer_asks(site, term, where):
    assert where in _search(site, term)


def test_the_readmes_links_lead_to_pages():
    """The README is outside the site (mkdocs does not check it): its links into docs/ must lead somewhere."""
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text())
    broken = [link for link in links if "://" not in link and not (ROOT / link).is_file()]
    assert links and not broken
