"""The model repository's contract: the schema of ``models/<name>/manifest.json``.

Training writes it (``python -m training export``), the service validates it before serving anything; both
import this module, which depends on pydantic and :mod:`fusion`'s registry of methods alone.
``models/manifest.schema.json`` is its JSON Schema, generated from :class:`Manifest` (a test keeps the two
equal).
"""

from __future__ import annotations

from itertools import pairwise
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fusion import Method

if TYPE_CHECKING:
    from calibration import ModelCalibration

# 2 added `calibration`. Version 1 manifests (no calibration section) still load, so that models exported
# before it keep serving, without `confidence` or `prediction_set`; a version 2 manifest must have it.
SCHEMA_VERSION = 2

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
"""What a model's or a view's name may be: it travels in URLs and JSON keys."""

MAX_NAME_LENGTH = 250
"""The longest model, view or version name, in characters: a view's is its file's, ``<view>.onnx``, at most
255 bytes, and each travels in URLs (a name of a megabyte loaded, and no request could reach the model)."""

MAX_CLASS_NAME_LENGTH = 1024
"""The longest class name, in characters: every answer carries it once per sample, outside the numbers
``DBF_MAX_ANSWER_VALUES`` bounds (class names of a megabyte made a 60 kB request's answer 200 MB)."""

MAX_VIEW_DIM = 65536
"""The widest view the service serves unless ``DBF_MAX_VIEW_DIM`` says otherwise (a request that leaves a
view out has it sent to its head as zeros: samples x dim of them); ``fit`` refuses wider ones alike."""


class _Strict(BaseModel):
    # Every number finite: an Infinity or NaN (JSON has neither, but parsers take them) loads, then breaks
    # every request that uses it.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ViewEntry(_Strict):
    """One view's head: its ONNX file maps raw features ``(N, dim)`` float32 to evidence ``(N, K)``."""

    name: str = Field(
        pattern=NAME_PATTERN,
        max_length=MAX_NAME_LENGTH,
        description="the view's name, the key clients send its features under",
    )
    dim: int = Field(ge=1, description="feature dimension (the service takes at most DBF_MAX_VIEW_DIM)")
    file: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*\.onnx$", description="ONNX file beside the manifest"
    )
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="SHA-256 of the file, hex")


class FusionDefaults(_Strict):
    method: Method = "dbf"
    lam: float = Field(default=1.0, gt=0, alias="lambda", description="DBF's lambda, positive and finite")

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, populate_by_name=True)


class FlagRates(_Strict):
    clean: float = Field(ge=0, le=1, description="share of clean samples flagged (false-positive rate)")
    conflictive: float = Field(
        ge=0, le=1, description="share of conflictive samples flagged (detection rate)"
    )


class ConflictFlag(_Strict):
    """When a prediction is flagged ``high_conflict``: ``score >= threshold``.

    The threshold is the quantile of the score on clean validation samples that flags
    ``target_false_positive_rate`` of them; the score is whichever of fused uncertainty and largest pairwise
    conflict flags more of their conflictive copies at its threshold (``validation_auroc``: how each separates
    them overall). Validation samples: those the calibration section was fitted on (its ``fitted_on``).
    """

    score: Literal["uncertainty", "max_conflict"]
    threshold: float = Field(ge=0, le=1)
    target_false_positive_rate: float = Field(gt=0, lt=1)
    validation_auroc: dict[Literal["uncertainty", "max_conflict"], Annotated[float, Field(ge=0, le=1)]]
    validation: FlagRates
    test: FlagRates


class OutOfRange(_Strict):
    """When a view of a sample is ``out_of_range``, and fused as if it were missing: its head's
    ``range_excess`` (the root mean square of its features' distances outside the training range, in units
    of each feature's training span; ``training.export.head_to_onnx``) is above ``threshold``, or not a
    number. Heads exported without that output are never out of range."""

    threshold: float = Field(
        default=0.2,
        gt=0,
        description="the largest range_excess still in range (the default is chosen on the committed models' "
        "data: README, 'Running it in production')",
    )


class ViewAgreement(_Strict):
    """How often one view's top class is that of the other views fused cumulatively
    (``fusion.agrees_with_the_others``), over the samples that have every view (as the service counts it): a
    label-free sign of a view that fails within its training range (shuffled, stuck, turned to noise),
    which agrees far less, whichever view the fused prediction follows. Measured on the clean samples the
    flag's threshold is calibrated on (the calibration's ``fitted_on``); the fusion method plays no part."""

    clean: float = Field(ge=0, le=1, description="the share of clean calibration samples that agree")
    clean_low: float = Field(
        ge=0,
        le=1,
        description="the low end of that share's 95% interval (Clopper-Pearson): the clean rate the samples "
        "vouch for, which the agreement alert measures against",
    )
    samples: int = Field(ge=1, description="how many clean calibration samples it rests on")
    chance: float = Field(
        ge=0,
        le=1,
        description="the share a view whose top class is independent of the other views' would agree on "
        "those samples: the sum over classes of the view's share of top classes times the others'",
    )
    test: float | None = Field(default=None, ge=0, le=1, description="the share of clean test samples")
    test_samples: int | None = Field(default=None, ge=1, description="how many clean test samples")

    @property
    def alert_below(self) -> float:
        """The agreement below which ``DBFViewDisagreement`` fires: halfway from the low end of the clean
        rate's interval to chance (deploy/prometheus/alerts.yml), so that a clean rate measured on few
        samples does not make clean traffic cross it."""
        return (self.clean_low + self.chance) / 2


class Metrics(_Strict):
    acc_normal: float = Field(ge=0, le=1, description="accuracy on the clean held-out test split")
    acc_conflict: float = Field(ge=0, le=1, description="accuracy on its conflictive copy")
    auc: float = Field(ge=0, le=1, description="AUROC of 'is conflictive' scored by fused uncertainty")
    acc_all_samples: float = Field(ge=0, le=1, description="accuracy over every sample of the dataset")


SCORE_ROUNDING = 1e-6
"""How far a stored probability-valued number (a conformal score, an isotonic knot) may stray outside its
range by float rounding."""

_TEMPERATURE = Field(
    ge=1e-7,
    le=1e4,
    allow_inf_nan=False,
    description="positive; calibration searches [1e-6, 1e3], and a decade beyond either end is no fit's",
)


class TemperatureCalibration(_Strict):
    """``confidence`` = the projected probability of the label with the fused evidence divided by ``T``.

    ``(b_k + u T / K) / (1 - u + u T)`` at the label; see ``calibration.scaled_probability``.
    """

    kind: Literal["temperature"]
    temperature: float = _TEMPERATURE


class IsotonicCalibration(_Strict):
    """``confidence`` = piecewise-linear interpolation of ``values`` at ``thresholds`` (constant beyond them)
    of the temperature-scaled top-class probability; see ``calibration.IsotonicBinning``."""

    kind: Literal["isotonic"]
    temperature: float = _TEMPERATURE
    thresholds: list[float] = Field(
        min_length=1, description="knot positions, top-class probabilities in [0, 1], strictly increasing"
    )
    values: list[float] = Field(
        min_length=1, description="confidence at each knot, non-decreasing, in [0, 1]"
    )

    @model_validator(mode="after")
    def _monotone(self) -> IsotonicCalibration:
        x, y = self.thresholds, self.values
        if len(x) != len(y):
            raise ValueError(f"thresholds ({len(x)}) and values ({len(y)}) must have the same length")
        if any(b <= a for a, b in pairwise(x)) or any(b < a for a, b in pairwise(y)):
            raise ValueError("thresholds must increase strictly and values must not decrease")
        if not all(0 <= v <= 1 for v in y):
            raise ValueError("values must lie in [0, 1]")
        if not -SCORE_ROUNDING <= x[0] <= x[-1] <= 1 + SCORE_ROUNDING:
            raise ValueError(
                f"thresholds are top-class probabilities, in [0, 1]; these span [{x[0]}, {x[-1]}]"
            )
        return self


ConfidenceCalibration = Annotated[TemperatureCalibration | IsotonicCalibration, Field(discriminator="kind")]


class ConformalScore(_Strict):
    """The nonconformity score of the prediction sets (``calibration.NonconformityScore``)."""

    kind: Literal["lac", "aps", "raps"]
    penalty: float = Field(default=0.0, ge=0, allow_inf_nan=False, description="RAPS's lambda; 0 otherwise")
    free_rank: int = Field(default=0, ge=0, description="RAPS's k_reg; 0 otherwise")

    @model_validator(mode="after")
    def _regularised_only_for_raps(self) -> ConformalScore:
        if self.kind != "raps" and (self.penalty, self.free_rank) != (0, 0):
            raise ValueError(f"a {self.kind} score takes no penalty or free_rank")
        return self


class ConformalSets(_Strict):
    """Split conformal prediction sets over the projected probability, for any coverage up to n / (n + 1)."""

    score: ConformalScore
    calibration_scores: list[float] = Field(
        min_length=1, description="the validation samples' scores of their true classes, ascending"
    )
    default_coverage: float = Field(gt=0, lt=1, description="the coverage of a request that names none")

    @model_validator(mode="after")
    def _sorted_and_supported(self) -> ConformalSets:
        scores = self.calibration_scores
        if any(b < a for a, b in pairwise(scores)):
            raise ValueError("calibration_scores must be sorted ascending")
        n = len(scores)
        if self.default_coverage > n / (n + 1):
            raise ValueError(
                f"default_coverage {self.default_coverage} needs more than the {n} calibration scores "
                f"(at most n / (n + 1) = {n / (n + 1):.6g})"
            )
        return self


class CalibrationSelection(_Strict):
    """The cross-validated evidence the calibrators were chosen by (lower is better in both)."""

    confidence_brier: dict[str, float] = Field(
        description="Brier score of each confidence calibrator, and of the projected probability"
    )
    mean_candidates: dict[str, float] = Field(
        description="each candidate score's mean number of classes its sets leave to choose from (an empty "
        "set leaves all K), at the default coverage"
    )


class CalibrationFigures(_Strict):
    """How the calibration does on one split, prediction sets at the default coverage."""

    samples: int = Field(ge=1)
    ece_projected: float = Field(ge=0, le=1, description="ECE of the projected probability's top class")
    ece_confidence: float = Field(ge=0, le=1, description="ECE of `confidence`")
    coverage: float = Field(ge=0, le=1, description="share of clean samples whose set holds the true class")
    mean_set_size: float = Field(ge=0)
    conflictive_coverage: float | None = Field(default=None, ge=0, le=1)
    conflictive_mean_set_size: float | None = Field(default=None, ge=0)


class CalibrationSamples(_Strict):
    """The clean samples the flag's threshold, the confidence calibrator and the conformal scores were
    fitted on, and so which coverage guarantee the prediction sets have."""

    kind: Literal["validation", "cross-fitted"] = Field(
        description="`validation`: the model's own evidence on the clean validation split (split conformal: "
        "a set holds the true class with probability at least the coverage asked for); `cross-fitted`: "
        "out-of-fold evidence on every non-test sample from `folds` models trained like this one, each "
        "without its fold (cross-conformal: at least 1 - 2 (1 - coverage) in theory, close to the coverage "
        "in practice)"
    )
    samples: int = Field(ge=1, description="how many clean samples")
    folds: int | None = Field(default=None, ge=2, description="cross-fitted: how many fold models")

    @model_validator(mode="after")
    def _folds_when_cross_fitted(self) -> CalibrationSamples:
        if (self.kind == "cross-fitted") != (self.folds is not None):
            raise ValueError("folds is given for cross-fitted calibration, and only for it")
        return self


class Calibration(_Strict):
    """``confidence`` and ``prediction_set``: fitted on clean samples (``fitted_on``; ``calibration``
    package).

    Validation figures are those of the samples fitted on, cross-validated (each sample scored by a fit
    that did not see it).
    """

    confidence: ConfidenceCalibration
    conformal: ConformalSets
    selection: CalibrationSelection
    validation: CalibrationFigures
    test: CalibrationFigures | None = None
    fitted_on: CalibrationSamples | None = Field(
        default=None, description="absent in models calibrated before it was recorded: the validation split"
    )

    def applied(self) -> ModelCalibration:
        """The section as the ``calibration`` package applies it (the service, per request)."""
        from calibration import ModelCalibration

        return ModelCalibration.from_parameters(
            confidence=self.confidence.model_dump(),
            score=self.conformal.score.model_dump(),
            calibration_scores=self.conformal.calibration_scores,
            default_coverage=self.conformal.default_coverage,
        )


class Manifest(_Strict):
    """``manifest.json``: everything the service needs to load, check and explain one model."""

    schema_version: Literal[1, 2] = Field(
        default=SCHEMA_VERSION, description="2 with a calibration section, 1 without (older models)"
    )
    name: str = Field(pattern=NAME_PATTERN, max_length=MAX_NAME_LENGTH)
    version: str = Field(
        default="1",
        pattern=NAME_PATTERN,
        max_length=MAX_NAME_LENGTH,
        description="the model's version, as the Open Inference Protocol's model routes and metadata name it",
    )
    dataset: str
    classes: list[Annotated[str, Field(max_length=MAX_CLASS_NAME_LENGTH)]] = Field(
        min_length=2, description="class names in label order"
    )
    views: list[ViewEntry] = Field(min_length=1, description="in the order the conflict matrix uses")
    fusion: FusionDefaults
    conflict_flag: ConflictFlag
    metrics: Metrics
    training: dict[str, object] = Field(description="how the heads were trained (settings, seed, epochs)")
    provenance: dict[str, str] = Field(description="versions of the code and libraries that made it")
    calibration: Calibration | None = Field(
        default=None, description="calibrated confidence and conformal sets; required from schema version 2"
    )
    out_of_range: OutOfRange = Field(
        default=OutOfRange(), description="when a view's features are too far outside its training range"
    )
    view_agreement: dict[str, ViewAgreement] | None = Field(
        default=None,
        description="per view, how often its top class is that of the other views fused, on clean data; "
        "absent in models exported before it was measured (they have no agreement alert)",
    )

    @model_validator(mode="before")
    @classmethod
    def _version_from_content(cls, data: Any) -> Any:
        # A manifest built without naming its version is version 2 if it has a calibration section, else 1.
        if isinstance(data, dict) and "schema_version" not in data:
            data = {**data, "schema_version": 2 if data.get("calibration") is not None else 1}
        return data

    @model_validator(mode="after")
    def _calibration_matches_version(self) -> Manifest:
        if (self.schema_version >= 2) != (self.calibration is not None):
            raise ValueError(
                "schema_version 2 requires a calibration section and version 1 has none; got version "
                f"{self.schema_version} {'with' if self.calibration is not None else 'without'} one"
            )
        return self

    @field_validator("views")
    @classmethod
    def _distinct(cls, views: list[ViewEntry]) -> list[ViewEntry]:
        for attribute in ("name", "file"):
            values = [getattr(view, attribute) for view in views]
            if len(set(values)) != len(values):
                raise ValueError(f"view {attribute}s must be distinct, got {values}")
        return views

    @model_validator(mode="after")
    def _agreement_of_known_views(self) -> Manifest:
        unknown = set(self.view_agreement or ()) - {view.name for view in self.views}
        if unknown:
            raise ValueError(f"view_agreement names views the model does not have: {sorted(unknown)}")
        return self

    @model_validator(mode="after")
    def _conformal_scores_possible(self) -> Manifest:
        # Scores outside their range load and serve silently wrong sets: below 0, every set empty; far above
        # its highest, every class in every set.
        if self.calibration is None:
            return self
        conformal = self.calibration.conformal
        score = conformal.score
        highest = 1 + score.penalty * len(self.classes)  # whatever free_rank: at most K ranks are penalised
        low, high = conformal.calibration_scores[0], conformal.calibration_scores[-1]  # sorted
        if low < -SCORE_ROUNDING or high > highest + SCORE_ROUNDING:
            raise ValueError(
                f"calibration_scores of a {score.kind} score over {len(self.classes)} classes lie in "
                f"[0, {highest:g}]; these span [{low:g}, {high:g}]"
            )
        return self

    @model_validator(mode="after")
    def _classes_distinct(self) -> Manifest:
        if len(set(self.classes)) != len(self.classes):
            raise ValueError("class names must be distinct")
        return self

    def json_text(self) -> str:
        """The canonical file text: sorted keys, two-space indent, a final newline (stable bytes)."""
        import json

        # A version 1 manifest is written without the keys version 2 added, byte for byte as before; so is
        # one written before `out_of_range` or the calibration's `fitted_on` existed (defaults, unwritten).
        absent: dict[str, object] = {"calibration": True, "version": True} if self.schema_version == 1 else {}
        if "out_of_range" not in self.model_fields_set:
            absent["out_of_range"] = True
        if self.view_agreement is None:
            absent["view_agreement"] = True
        if self.calibration is not None and "fitted_on" not in self.calibration.model_fields_set:
            absent.setdefault("calibration", {"fitted_on": True})
        content = self.model_dump(mode="json", by_alias=True, exclude=absent)
        return json.dumps(content, indent=2, sort_keys=True) + "\n"


def json_schema_text() -> str:
    """``models/manifest.schema.json``'s text, generated from :class:`Manifest`."""
    import json

    schema = Manifest.model_json_schema(by_alias=True)
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


__all__ = [
    "SCHEMA_VERSION",
    "MAX_CLASS_NAME_LENGTH",
    "MAX_NAME_LENGTH",
    "NAME_PATTERN",
    "Calibration",
    "CalibrationFigures",
    "CalibrationSamples",
    "CalibrationSelection",
    "ConfidenceCalibration",
    "ConflictFlag",
    "ConformalScore",
    "ConformalSets",
    "FlagRates",
    "FusionDefaults",
    "IsotonicCalibration",
    "Manifest",
    "Metrics",
    "OutOfRange",
    "TemperatureCalibration",
    "ViewAgreement",
    "ViewEntry",
    "json_schema_text",
]
