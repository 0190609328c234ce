"""The committed model repository (models/): valid manifests, intact files, and the accuracy it promises."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import scipy.stats

import manifest
from fusion import fuse, opinion_from_evidence
from training.agreement_tables import measured_agreement
from training.export import exported_evidence
from training.readers import load

MODELS = Path(__file__).resolve().parents[1] / "models"
# Issue 4: DBF over the committed heads, over all samples of each dataset, classifies at least this well.
REQUIRED_ACCURACY = {"handwritten": 0.95, "pie": 0.85, "scene15": 0.65, "cub": 0.80}


def test_schema_file_is_generated_from_the_model():
    assert (MODELS / "manifest.schema.json").read_text() == manifest.json_schema_text()


@pytest.mark.parametrize("name", sorted(REQUIRED_ACCURACY))
def test_committed_model_is_valid_and_intact(name):
    entry = manifest.Manifest.model_validate_json((MODELS / name / "manifest.json").read_text())
    assert entry.name == name
    assert entry.fusion.method == "dbf"
    assert entry.fusion.lam == 1.0
    assert entry.conflict_flag.target_false_positive_rate == 0.05
    for view in entry.views:
        assert hashlib.sha256((MODELS / name / view.file).read_bytes()).hexdigest() == view.sha256
    assert sorted(p.name for p in (MODELS / name).iterdir()) == sorted(
        ["manifest.json", *(v.file for v in entry.views)]
    )


@pytest.mark.data
@pytest.mark.parametrize("name", sorted(REQUIRED_ACCURACY))
def test_committed_model_classifies_the_whole_dataset(name, data_dir):
    data = load(name, data_dir)
    evidence = exported_evidence(MODELS / name, data.views)
    fused = fuse(opinion_from_evidence(evidence), "dbf", lam=1.0)
    assert np.mean(fused.probability.argmax(-1) == data.labels) >= REQUIRED_ACCURACY[name]


@pytest.mark.data
@pytest.mark.parametrize("name", sorted(REQUIRED_ACCURACY))
def test_committed_view_agreement_is_what_the_heads_give_on_the_splits_they_were_calibrated_on(
    name, data_dir
):
    # `python -m training view-agreement models/NAME --write` added it to heads exported before it existed.
    committed = manifest.Manifest.model_validate_json((MODELS / name / "manifest.json").read_text())
    measured = measured_agreement(MODELS / name, data_dir)
    assert committed.view_agreement == measured.view_agreement
    assert set(committed.view_agreement) == {view.name for view in committed.views}
    splits = committed.training["splits"]
    for view, rates in committed.view_agreement.items():
        assert (rates.samples, rates.test_samples) == (splits["validation"], splits["test"])
        agreed = round(rates.clean * rates.samples)  # the 95% Clopper-Pearson low end of agreed of samples
        low = scipy.stats.beta.ppf(0.025, agreed, rates.samples - agreed + 1) if agreed else 0.0
        assert rates.clean_low == pytest.approx(low, rel=1e-9), view
        # Clean test traffic, other samples than those measured on, stays above the alert's threshold.
        assert rates.test > rates.alert_below > rates.chance, view
