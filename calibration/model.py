"""One model's calibration as the service applies it: confidence and prediction sets per request."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from calibration.confidence import ConfidenceCalibrator, confidence_calibrator, scaled_probability
from calibration.conformal import NonconformityScore, conformal_rank, max_coverage, prediction_set


@dataclass(frozen=True, eq=False)
class ModelCalibration:
    """A model's fitted confidence calibrator and conformal calibration, ready to apply.

    Parameters
    ----------
    confidence_calibrator : TemperatureScaling or IsotonicBinning
    score : NonconformityScore
    calibration_scores : ndarray, shape (n,)
        Ascending (checked).
    default_coverage : float
        Used when a request names no coverage; at most ``n / (n + 1)`` (checked).

    Examples
    --------
    >>> calibrated = ModelCalibration.from_parameters(
    ...     confidence={"kind": "temperature", "temperature": 0.05},
    ...     score={"kind": "lac"},
    ...     calibration_scores=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9],
    ...     default_coverage=0.8,
    ... )
    >>> belief, uncertainty = np.array([[0.45, 0.0, 0.0], [0.2, 0.2, 0.0]]), np.array([0.55, 0.6])
    >>> calibrated.confidence(belief, uncertainty).round(2).tolist()
    [0.96, 0.49]
    >>> probability = belief + uncertainty[:, None] / 3  # DBF's projected probability
    >>> calibrated.prediction_set(probability).tolist()  # q = 0.8: classes with probability >= 0.2
    [[True, False, False], [True, True, True]]
    >>> calibrated.max_coverage
    0.9
    """

    confidence_calibrator: ConfidenceCalibrator
    score: NonconformityScore
    calibration_scores: np.ndarray
    default_coverage: float

    def __post_init__(self) -> None:
        scores = np.asarray(self.calibration_scores, dtype=np.float64)
        if (
            scores.ndim != 1
            or scores.size == 0
            or np.any(np.diff(scores) < 0)
            or not np.all(np.isfinite(scores))
        ):
            raise ValueError("calibration_scores must be a non-empty, finite, ascending vector")
        scores.setflags(write=False)
        object.__setattr__(self, "calibration_scores", scores)
        conformal_rank(scores.size, coverage=self.default_coverage)  # CoverageError if unsupported

    @classmethod
    def from_parameters(
        cls,
        *,
        confidence: Mapping[str, object],
        score: Mapping[str, object],
        calibration_scores: Sequence[float],
        default_coverage: float,
    ) -> ModelCalibration:
        """Build it from plain parameters, as the model manifest's ``calibration`` section stores them."""
        return cls(
            confidence_calibrator=confidence_calibrator(dict(confidence)),
            score=NonconformityScore(**score),
            calibration_scores=np.asarray(calibration_scores, dtype=np.float64),
            default_coverage=float(default_coverage),
        )

    @property
    def max_coverage(self) -> float:
        """The highest coverage a request may ask for, ``n / (n + 1)``."""
        return max_coverage(self.calibration_scores.size)

    def confidence(self, belief: npt.ArrayLike, uncertainty: npt.ArrayLike, /) -> np.ndarray:
        """Calibrated probability (N,) that the label is right; belief (N, K), uncertainty (N,)."""
        return self.confidence_calibrator.confidence(belief, uncertainty)

    def prediction_set(self, probability: npt.ArrayLike, /, *, coverage: float | None = None) -> np.ndarray:
        """Set membership (N, K) at ``coverage`` (the default when None) for projected probabilities (N, K).

        Raises :class:`~calibration.CoverageError` for a coverage the calibration set cannot support.
        """
        return prediction_set(
            probability,
            self.calibration_scores,
            coverage=self.default_coverage if coverage is None else coverage,
            score=self.score,
        )

    def projected_probability(self, belief: npt.ArrayLike, uncertainty: npt.ArrayLike, /) -> np.ndarray:
        """DBF's projected probability ``b + u / K`` (N, K), the input of :meth:`prediction_set`."""
        return scaled_probability(belief, uncertainty, temperature=1.0)


__all__ = ["ModelCalibration"]
