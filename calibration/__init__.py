"""Calibrated confidence and conformal prediction sets for DBF's fused predictions.

Pure numpy, no I/O: training fits these on the validation split and writes their parameters into the model
manifest; the service rebuilds them from the manifest and applies them per request. Neither the label nor
DBF's belief, uncertainty, conflict or discounts change.

* :mod:`calibration.confidence`: ``confidence`` (N,), the calibrated probability that the label (the argmax
  of the projected probability) is right: temperature scaling of the fused evidence or isotonic binning,
  whichever has the lower cross-validated Brier score.
* :mod:`calibration.conformal`: split conformal prediction sets (N, K) over the projected probability, for
  any coverage the calibration set supports, with LAC, APS or RAPS scores.
* :class:`ModelCalibration`: both, rebuilt from a model manifest's parameters and applied per request.
* :mod:`calibration.reliability`: reliability diagrams and the expected calibration error.

>>> import numpy as np
>>> from calibration import TemperatureScaling, calibration_scores, prediction_set, scaled_probability
>>> belief, uncertainty = np.array([[0.45, 0.0, 0.0], [0.2, 0.2, 0.0]]), np.array([0.55, 0.6])
>>> probability = scaled_probability(belief, uncertainty, temperature=1.0)  # DBF's projected probability
>>> TemperatureScaling(0.05).confidence(belief, uncertainty).round(2).tolist()
[0.96, 0.49]
>>> scores = calibration_scores(probability, np.array([0, 1]))
>>> prediction_set(probability, scores, coverage=0.6).tolist()
[[True, False, False], [True, True, False]]
"""

from calibration.confidence import (
    CALIBRATORS,
    ConfidenceCalibrator,
    ConfidenceFit,
    ConfidenceKind,
    IsotonicBinning,
    TemperatureScaling,
    confidence_calibrator,
    fit_confidence,
    fit_isotonic,
    fit_temperature,
    scaled_probability,
    top_probability,
)
from calibration.conformal import (
    APS,
    LAC,
    RAPS_PENALTIES,
    SCORE_KINDS,
    CoverageError,
    NonconformityScore,
    ScoreChoice,
    ScoreKind,
    calibration_scores,
    choose_score,
    conformal_quantile,
    conformal_rank,
    label_ranks,
    max_coverage,
    min_calibration_samples,
    prediction_set,
)
from calibration.folds import cross_validation_folds
from calibration.model import ModelCalibration
from calibration.reliability import (
    ReliabilityDiagram,
    ece_gap_low,
    ece_noise,
    expected_calibration_error,
    reliability_diagram,
)

__all__ = [
    # confidence
    "CALIBRATORS",
    "ConfidenceCalibrator",
    "ConfidenceFit",
    "ConfidenceKind",
    "IsotonicBinning",
    "TemperatureScaling",
    "confidence_calibrator",
    "fit_confidence",
    "fit_isotonic",
    "fit_temperature",
    "scaled_probability",
    "top_probability",
    # conformal
    "APS",
    "LAC",
    "RAPS_PENALTIES",
    "SCORE_KINDS",
    "CoverageError",
    "NonconformityScore",
    "ScoreChoice",
    "ScoreKind",
    "calibration_scores",
    "choose_score",
    "conformal_quantile",
    "conformal_rank",
    "label_ranks",
    "max_coverage",
    "min_calibration_samples",
    "prediction_set",
    # one model's calibration, applied per request
    "ModelCalibration",
    # reliability and folds
    "ReliabilityDiagram",
    "cross_validation_folds",
    "ece_gap_low",
    "ece_noise",
    "expected_calibration_error",
    "reliability_diagram",
]
