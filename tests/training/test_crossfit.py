"""Cross-fitted calibration, measured over many random data sets: the prediction sets' coverage and the
flag's clean rate on new samples, against calibrating on the small validation split alone.

The models are cheap stand-ins for the heads (each view's class means, evidence falling with the distance
to them), trained on exactly the rows fit's models train on: the served model on the training split, the
fold models as :func:`training.crossfit.plan_cross_fitting` plans them. Everything else is what fit runs:
the protocol's sets, the folds, the fusion (:meth:`FusedSplit.of_evidence`) and :func:`calibrate`.
"""

from __future__ import annotations

import numpy as np
import pytest

from training.calibrate import FusedSplit, calibrate, flag_scores
from training.crossfit import FOLDS, fused_out_of_fold, out_of_fold, plan_cross_fitting
from training.data import synthetic
from training.metrics import coverage_band
from training.protocol import Samples, evaluation_sets
from training.train import TrainConfig

SAMPLES, NEW, CLASSES, DRAWS = 300, 2000, 4, 200
LEVEL, TARGET = 0.9, 0.05


class CentroidHeads:
    """Per view, evidence ``20 exp(-|x - mean_k|^2 / 2)`` for each class k, the means from the rows trained
    on: confident near a class's mean, uncertain between them."""

    def __init__(self, views: dict[str, np.ndarray], labels: np.ndarray, rows: np.ndarray) -> None:
        self.means = [
            np.stack([matrix[rows[labels[rows] == k]].mean(axis=0) for k in range(CLASSES)])
            for matrix in views.values()
        ]

    def evidence(self, features: list[np.ndarray]) -> np.ndarray:
        distances = [
            ((x[:, None, :] - means[None]) ** 2).sum(-1)
            for x, means in zip(features, self.means, strict=True)
        ]
        return np.stack([20 * np.exp(-d / 2) for d in distances], axis=1)  # (N, V, K)


def fused(heads: CentroidHeads, clean: Samples, conflictive: Samples) -> FusedSplit:
    return FusedSplit.of_evidence(
        heads.evidence(clean.features()),
        clean.labels,
        method="dbf",
        lam=1.0,
        conflictive=(heads.evidence(conflictive.features()), conflictive.labels, None),
    )


def one_draw(seed: int) -> dict[str, tuple[float, float]]:
    """Coverage at LEVEL and the flag's clean rate on NEW samples, cross-fitted and on validation alone."""
    everything = synthetic(SAMPLES + NEW, num_classes=CLASSES, dims=(3, 3), noise=1.2, seed=seed)
    data = everything.take(np.arange(SAMPLES))
    sets = evaluation_sets(data, seed=seed, conflictive=("validation", "test"))
    plan = plan_cross_fitting(sets, num_classes=CLASSES, seed=seed)
    served = CentroidHeads(sets.views, data.labels, sets.train.rows)
    folds = [CentroidHeads(sets.views, data.labels, rows) for rows in plan.training]
    cross_fitted = fused_out_of_fold(
        plan, lambda k, samples: folds[k].evidence(samples.features()), method="dbf", lam=1.0
    )
    new_views = sets.scaler.transform({v: m[SAMPLES:] for v, m in everything.views.items()})
    new = FusedSplit.of_evidence(
        served.evidence(list(new_views.values())), everything.labels[SAMPLES:], method="dbf", lam=1.0
    )
    out = {}
    for name, split, k in (
        ("cross-fitted", cross_fitted, plan.folds),
        ("validation", fused(served, sets.validation, sets.conflictive["validation"]), None),
    ):
        post_hoc = calibrate(split, target_false_positive_rate=TARGET, folds=k, seed=seed)
        calibrated = post_hoc.section.applied()
        members = calibrated.prediction_set(
            calibrated.projected_probability(new.clean.belief, new.clean.uncertainty), coverage=LEVEL
        )
        scores = flag_scores(new.clean)[post_hoc.score]
        out[name] = (members[np.arange(NEW), new.labels].mean(), np.mean(scores >= post_hoc.threshold))
    return out


@pytest.fixture(scope="module")
def draws() -> dict[str, np.ndarray]:
    results = [one_draw(seed) for seed in range(DRAWS)]
    return {name: np.array([r[name] for r in results]) for name in ("cross-fitted", "validation")}


def test_small_validation_splits_are_cross_fitted_on_every_non_test_sample():
    data = synthetic(SAMPLES, num_classes=CLASSES, dims=(3, 3), seed=0)
    sets = evaluation_sets(data, seed=0, conflictive=("validation", "test"))
    plan = plan_cross_fitting(sets, num_classes=CLASSES, seed=0)
    assert plan.folds == FOLDS and len(sets.validation) == 28
    non_test = np.sort(np.concatenate([sets.train.rows, sets.validation.rows]))
    held = np.concatenate([fold.rows for fold in plan.held_out])
    assert np.array_equal(np.sort(held), non_test)  # every non-test sample held out exactly once
    assert len({rows.size for rows in plan.training}) == 1  # one stacked run
    for rows, fold in zip(plan.training, plan.held_out, strict=True):
        assert not np.intersect1d(rows, fold.rows).size  # no model sees its own fold
        assert rows.size >= non_test.size - fold.rows.size - 1  # at most one sample left out to even up
    for fold, copies in zip(plan.held_out, plan.conflictive, strict=True):
        assert np.isin(copies.donors, fold.rows).all()  # donors from the same fold


def test_cross_fitted_prediction_sets_cover_as_asked_with_less_spread_than_the_validation_split(draws):
    covered, alone = draws["cross-fitted"][:, 0], draws["validation"][:, 0]
    # Over the data sets, the mean coverage on new samples is the level asked for.
    assert LEVEL - 0.01 <= covered.mean() <= LEVEL + 0.03
    # The guarantee stated for cross-fitting: at least 1 - 2 (1 - c).
    assert covered.min() >= 1 - 2 * (1 - LEVEL)
    # Split conformal on the validation samples alone holds on average, but each draw varies more: its
    # coverage is Beta-distributed about the level, and cross-fitting has 8x the samples.
    assert LEVEL - 0.01 <= alone.mean() <= LEVEL + 0.04
    assert covered.std() < 0.6 * alone.std()
    # Most draws land where split conformal on as many samples would put them.
    low, high = coverage_band(NEW, LEVEL, calibration=SAMPLES * 4 // 5)
    assert np.mean((covered >= low) & (covered <= high)) >= 0.85


def test_the_cross_fitted_flag_raises_near_its_target_on_new_clean_samples(draws):
    flagged, alone = draws["cross-fitted"][:, 1], draws["validation"][:, 1]
    assert 0.03 <= flagged.mean() <= 0.08
    assert flagged.std() < 0.6 * alone.std()  # a threshold from 8x the samples


def test_the_fold_models_stop_at_the_time_limit_and_the_fit_says_so():
    data = synthetic(SAMPLES, num_classes=CLASSES, dims=(3, 3), seed=0)
    sets = evaluation_sets(data, seed=0, conflictive=("validation", "test"))
    plan = plan_cross_fitting(sets, num_classes=CLASSES, seed=0)
    config = TrainConfig(epochs=1)
    unlimited = out_of_fold(plan, sets, num_classes=CLASSES, config=config, epochs=3, progress=False)
    assert (unlimited.epochs, unlimited.timed_out, unlimited.warnings()) == (3, False, [])
    limited = out_of_fold(
        plan, sets, num_classes=CLASSES, config=config, epochs=1000, time_limit=0.0, progress=False
    )
    assert limited.epochs == 1 and limited.timed_out  # the epoch running when the time is up ends the run
    assert len(limited.split.labels) == len(sets.train) + len(sets.validation)  # still every non-test sample
    (warning,) = limited.warnings()
    assert "stopped at the time limit after 1 of 1000 epochs" in warning and "--max-minutes" in warning
