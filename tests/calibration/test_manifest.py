"""The manifest's calibration section (schema version 2): what it accepts, what it refuses, and how version 1
manifests without it keep loading."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from fusion import Opinion
from manifest import SCHEMA_VERSION, Calibration, Manifest, OutOfRange
from training.calibrate import FusedSplit, fit_confidence_and_sets

COMMITTED = Path(__file__).resolve().parents[2] / "models" / "handwritten" / "manifest.json"


@pytest.fixture(scope="module")
def section() -> Calibration:
    rng = np.random.default_rng(0)
    uncertainty = rng.uniform(0.1, 0.9, size=120)
    belief = rng.dirichlet(np.full(4, 0.5), size=120) * (1 - uncertainty)[:, None]
    labels = np.where(rng.random(120) < 0.8, belief.argmax(axis=1), rng.integers(4, size=120))
    return fit_confidence_and_sets(FusedSplit(Opinion(belief, uncertainty), labels), default_coverage=0.9)


def _with(section: Calibration, **changes) -> dict:
    content = json.loads(COMMITTED.read_text())
    content.pop("schema_version")
    content["calibration"] = section.model_dump(mode="json") if section is not None else None
    for path, value in changes.items():
        *parents, key = path.split("__")
        target = content
        for parent in parents:
            target = target[parent]
        target[key] = value
    return content


def test_a_manifest_with_a_calibration_section_is_version_2(section):
    loaded = Manifest.model_validate(_with(section))
    assert loaded.schema_version == SCHEMA_VERSION == 2
    assert Manifest.model_validate_json(loaded.json_text()) == loaded


def test_version_1_manifests_load_and_are_written_byte_for_byte_as_before():
    # A committed manifest as it was before version 2: no calibration, no model version.
    current = json.loads(COMMITTED.read_text())
    before = {k: v for k, v in current.items() if k not in ("calibration", "version")} | {"schema_version": 1}
    text = json.dumps(before, indent=2, sort_keys=True) + "\n"
    loaded = Manifest.model_validate_json(text)
    assert (loaded.schema_version, loaded.calibration) == (1, None)
    assert loaded.json_text() == text


def test_manifests_from_before_out_of_range_take_its_default_and_are_written_as_they_were():
    current = COMMITTED.read_text()
    before = {k: v for k, v in json.loads(current).items() if k != "out_of_range"}
    text = json.dumps(before, indent=2, sort_keys=True) + "\n"
    loaded = Manifest.model_validate_json(text)
    assert loaded.out_of_range == OutOfRange() and loaded.out_of_range.threshold == 0.2
    assert loaded.json_text() == text
    assert Manifest.model_validate_json(current).json_text() == current  # written out when given


def test_manifests_from_before_view_agreement_load_without_it_and_are_written_as_they_were():
    current = COMMITTED.read_text()
    before = {k: v for k, v in json.loads(current).items() if k != "view_agreement"}
    text = json.dumps(before, indent=2, sort_keys=True) + "\n"
    loaded = Manifest.model_validate_json(text)
    assert loaded.view_agreement is None
    assert loaded.json_text() == text
    assert Manifest.model_validate_json(current).json_text() == current


def test_a_views_agreement_alert_lies_halfway_from_its_clean_rates_low_end_to_chance():
    content = json.loads(COMMITTED.read_text())
    pix = Manifest.model_validate(content).view_agreement["pix"]
    assert pix.chance < pix.alert_below == (pix.clean_low + pix.chance) / 2 < pix.clean_low < pix.clean
    del content["view_agreement"]["pix"]["clean_low"]  # what the alert measures against: never assumed
    with pytest.raises(ValidationError, match=r"view_agreement\.pix\.clean_low\n\s+Field required"):
        Manifest.model_validate(content)


def test_view_agreement_may_name_only_the_models_views():
    content = json.loads(COMMITTED.read_text())
    content["view_agreement"]["pixels"] = content["view_agreement"]["pix"]
    with pytest.raises(
        ValidationError, match=r"view_agreement names views the model does not have: \['pixels'\]"
    ):
        Manifest.model_validate(content)


def test_version_and_section_must_agree(section):
    with pytest.raises(ValidationError, match="schema_version 2 requires a calibration section"):
        Manifest.model_validate({**_with(None), "schema_version": 2})
    with pytest.raises(ValidationError, match="version 1 has none"):
        Manifest.model_validate({**_with(section), "schema_version": 1})


@pytest.mark.parametrize(
    ("path", "value", "match"),
    [
        ("calibration__conformal__calibration_scores", [0.5, 0.2, 0.9], "sorted ascending"),
        (
            "calibration__conformal__calibration_scores",
            [0.1, 0.2],
            r"needs more than the 2 calibration scores",
        ),
        ("calibration__conformal__default_coverage", 1.0, "less than 1"),
        ("calibration__conformal__score", {"kind": "lac", "penalty": 0.1}, "a lac score takes no penalty"),
        ("calibration__conformal__score", {"kind": "thr"}, "'lac', 'aps' or 'raps'"),
        (
            "calibration__confidence",
            {"kind": "temperature", "temperature": 0},
            "greater than or equal to 0.0000001",
        ),
        (
            "calibration__confidence",
            {"kind": "temperature", "temperature": 1e308},
            "less than or equal to 10000",
        ),
        (
            "calibration__confidence",
            {"kind": "isotonic", "temperature": 1, "thresholds": [-1e308, 0.5], "values": [0.3, 0.4]},
            r"thresholds are top-class probabilities, in \[0, 1\]",
        ),
        (
            "calibration__confidence",
            {"kind": "isotonic", "temperature": 1, "thresholds": [0.5, 1e308], "values": [0.3, 0.4]},
            r"thresholds are top-class probabilities, in \[0, 1\]",
        ),
        # Below 0, every set was empty; far above 1, every class was in every set: loaded and served.
        (
            "calibration__conformal__calibration_scores",
            [-1.0] * 100,
            r"lie in \[0, [0-9.]+\]; these span \[-1, -1\]",
        ),
        (
            "calibration__conformal__calibration_scores",
            [0.1] * 99 + [1e300],
            r"lie in \[0, [0-9.]+\]; these span \[0.1, 1e\+300\]",
        ),
        (
            "calibration__confidence",
            {"kind": "platt", "temperature": 1},
            "does not match any of the expected tags",
        ),
        (
            "calibration__confidence",
            {"kind": "isotonic", "temperature": 1, "thresholds": [0.2, 0.1], "values": [0.3, 0.4]},
            "thresholds must increase strictly",
        ),
        (
            "calibration__confidence",
            {"kind": "isotonic", "temperature": 1, "thresholds": [0.1, 0.2], "values": [0.3]},
            "same length",
        ),
    ],
)
def test_malformed_sections_are_refused_with_the_reason(section, path, value, match):
    with pytest.raises(ValidationError, match=match):
        Manifest.model_validate(_with(section, **{path: value}))
