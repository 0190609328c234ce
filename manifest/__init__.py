"""The model repository's contract: the schema of ``models/<name>/manifest.json``.

Training writes it (``python -m training export``), the service validates it before serving anything; both
import this module, which depends on pydantic alone. ``models/manifest.schema.json`` is its JSON Schema,
generated from :class:`Manifest` (a test keeps the two equal).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SCHEMA_VERSION = 1

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
"""What a model's or a view's name may be: it travels in URLs and JSON keys."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ViewEntry(_Strict):
    """One view's head: its ONNX file maps raw features ``(N, dim)`` float32 to evidence ``(N, K)``."""

    name: str = Field(
        pattern=NAME_PATTERN, description="the view's name, the key clients send its features under"
    )
    dim: int = Field(ge=1, description="feature dimension")
    file: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*\.onnx$", description="ONNX file beside the manifest"
    )
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="SHA-256 of the file, hex")


class FusionDefaults(_Strict):
    method: Literal["bcf", "cbf", "baf", "gbaf", "dbf"] = "dbf"
    lam: float = Field(default=1.0, gt=0, alias="lambda", description="DBF's lambda")

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class FlagRates(_Strict):
    clean: float = Field(ge=0, le=1, description="share of clean samples flagged (false-positive rate)")
    conflictive: float = Field(
        ge=0, le=1, description="share of conflictive samples flagged (detection rate)"
    )


class ConflictFlag(_Strict):
    """When a prediction is flagged ``high_conflict``: ``score >= threshold``.

    The threshold is the quantile of the score on clean validation samples that flags
    ``target_false_positive_rate`` of them; the score is whichever of fused uncertainty and largest pairwise
    conflict separated clean from conflictive validation samples better (``validation_auroc``).
    """

    score: Literal["uncertainty", "max_conflict"]
    threshold: float = Field(ge=0, le=1)
    target_false_positive_rate: float = Field(gt=0, lt=1)
    validation_auroc: dict[Literal["uncertainty", "max_conflict"], float]
    validation: FlagRates
    test: FlagRates


class Metrics(_Strict):
    acc_normal: float = Field(ge=0, le=1, description="accuracy on the clean held-out test split")
    acc_conflict: float = Field(ge=0, le=1, description="accuracy on its conflictive copy")
    auc: float = Field(ge=0, le=1, description="AUROC of 'is conflictive' scored by fused uncertainty")
    acc_all_samples: float = Field(ge=0, le=1, description="accuracy over every sample of the dataset")


class Manifest(_Strict):
    """``manifest.json``: everything the service needs to load, check and explain one model."""

    schema_version: Literal[1] = SCHEMA_VERSION
    name: str = Field(pattern=NAME_PATTERN)
    dataset: str
    classes: list[str] = Field(min_length=2, description="class names in label order")
    views: list[ViewEntry] = Field(min_length=1, description="in the order the conflict matrix uses")
    fusion: FusionDefaults
    conflict_flag: ConflictFlag
    metrics: Metrics
    training: dict[str, object] = Field(description="how the heads were trained (settings, seed, epochs)")
    provenance: dict[str, str] = Field(description="versions of the code and libraries that made it")

    @field_validator("views")
    @classmethod
    def _distinct(cls, views: list[ViewEntry]) -> list[ViewEntry]:
        for attribute in ("name", "file"):
            values = [getattr(view, attribute) for view in views]
            if len(set(values)) != len(values):
                raise ValueError(f"view {attribute}s must be distinct, got {values}")
        return views

    @model_validator(mode="after")
    def _classes_distinct(self) -> Manifest:
        if len(set(self.classes)) != len(self.classes):
            raise ValueError("class names must be distinct")
        return self

    def json_text(self) -> str:
        """The canonical file text: sorted keys, two-space indent, a final newline (stable bytes)."""
        import json

        return json.dumps(self.model_dump(mode="json", by_alias=True), indent=2, sort_keys=True) + "\n"


def json_schema_text() -> str:
    """``models/manifest.schema.json``'s text, generated from :class:`Manifest`."""
    import json

    schema = Manifest.model_json_schema(by_alias=True)
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


__all__ = [
    "SCHEMA_VERSION",
    "NAME_PATTERN",
    "ConflictFlag",
    "FlagRates",
    "FusionDefaults",
    "Manifest",
    "Metrics",
    "ViewEntry",
    "json_schema_text",
]
