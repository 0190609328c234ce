"""The wire types of both protocols, in one place: msgspec structs that decode requests (in C, no per-value
Python), document them (the OpenAPI schema is generated from these, :mod:`service.api.openapi`) and let the
client decode answers into typed objects. numpy and msgspec only: the client imports this.

v1 (``/predict``): :class:`PredictRequest` in, :class:`PredictResponse` out, :class:`ErrorBody` on error.
Open Inference Protocol v2 (``/v2``): :class:`InferRequest` in, :class:`InferResponse` out,
:class:`V2ErrorBody` on error; its objects are extensible, so fields that are not ours are ignored.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import UNSET, Meta, UnsetType

from service.outputs import FIELDS

# The fusion options: v1's body fields, v2's request parameters.
_METHOD = Meta(description="fusion method; the model's default if omitted")
_LAMBDA = Meta(gt=0, description="DBF's lambda (Eq. 14); the model's default if omitted")
_COVERAGE = Meta(
    gt=0,
    lt=1,
    description="the prediction sets' coverage; the model's default if omitted, at most n / (n + 1) for "
    "its n calibration samples",
)

# --- v1 -------------------------------------------------------------------------------------------------


class Sample(msgspec.Struct, forbid_unknown_fields=True):
    views: Annotated[
        dict[str, list[float]],
        Meta(
            min_length=1,
            description="raw features per view name, as the training data stores them; any non-empty "
            "subset of the model's views",
        ),
    ]


class PredictRequest(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /predict`` and ``POST /v1/models/{name}/predict``."""

    samples: Annotated[list[Sample], Meta(min_length=1, description="up to DBF_MAX_SAMPLES samples")]
    method: Annotated[str, _METHOD] | UnsetType = UNSET
    lam: Annotated[float, _LAMBDA] | UnsetType = msgspec.field(default=UNSET, name="lambda")
    coverage: Annotated[float, _COVERAGE] | UnsetType = UNSET


# One prediction per sample, its fields those of the output registry (those of calibrated models optional:
# a client decodes the answers of models, and services, without calibration too).
Prediction = msgspec.defstruct(
    "Prediction",
    [
        (output.name, Annotated[output.field.type, Meta(description=output.description)])
        + ((None,) if output.calibrated else ())
        for output in FIELDS
    ],
    frozen=True,
    kw_only=True,
    module=__name__,
)
Prediction.__doc__ = "One sample's answer; ``conflict`` rows and columns are None for views it lacked."


class PredictResponse(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    method: str
    lam: float = msgspec.field(name="lambda")
    coverage: Annotated[
        float | None, Meta(description="the prediction sets' coverage (null: no calibration)")
    ] = None
    views: Annotated[list[str], Meta(description="the model's views, in the conflict matrix's order")]
    predictions: list[Prediction]  # type: ignore[valid-type]


class ErrorDetail(msgspec.Struct, frozen=True):
    type: Annotated[str, Meta(description="the reason, e.g. invalid_input, model_not_found, overloaded")]
    message: Annotated[str, Meta(description="what is wrong, and where (samples[i].views.<name>)")]


class ErrorBody(msgspec.Struct, frozen=True):
    """Every v1 error answer."""

    error: ErrorDetail


# --- Open Inference Protocol v2 ------------------------------------------------------------------------


def _reads(parameters: dict[str, Any]) -> Meta:
    """The documentation of a ``parameters`` object: the parameters this service reads, of these types (the
    protocol's objects are extensible: any other is ignored). It is decoded as any JSON object."""
    properties = {name: msgspec.json.schema(kind) for name, kind in parameters.items()}
    return Meta(extra_json_schema={"properties": properties})


class _Parameters(msgspec.Struct):
    """An object of the protocol with ``parameters``: ``null`` is read as none given, as KServe and MLServer
    read it (their pydantic request models write ``"parameters": null`` for parameters left out)."""

    def __post_init__(self) -> None:
        if self.parameters is None:
            self.parameters = {}


class InferInput(_Parameters):
    name: str
    datatype: str
    shape: list[int]
    parameters: Annotated[
        dict[str, Any] | None,
        _reads({"binary_data_size": Annotated[int, Meta(ge=0, description="bytes of its binary data")]}),
    ] = {}
    # Kept as raw JSON: decoded as flat float32 data in one typed pass (service.v2), nested only if need be.
    data: Annotated[msgspec.Raw, Meta(extra_json_schema={"type": "array", "items": {}})] | UnsetType = UNSET


class InferRequestedOutput(_Parameters):
    name: str
    parameters: Annotated[
        dict[str, Any] | None,
        _reads({"binary_data": Annotated[bool, Meta(description="this output as binary data")]}),
    ] = {}


class InferRequest(_Parameters):
    """``POST /v2/models/{name}[/versions/{version}]/infer``."""

    inputs: list[InferInput]
    id: str | None = None
    parameters: Annotated[
        dict[str, Any] | None,
        _reads(
            {
                "method": Annotated[str, _METHOD],
                "lambda": Annotated[float, _LAMBDA],
                "coverage": Annotated[float, _COVERAGE],
                "binary_data_output": Annotated[
                    bool, Meta(description="outputs as binary data, unless one says")
                ],
            }
        ),
    ] = {}
    outputs: list[InferRequestedOutput] | None = None


class InferOutput(msgspec.Struct):
    name: str
    datatype: str
    shape: list[int]
    parameters: dict[str, Any] = {}
    data: list[Any] | None = None


class InferResponse(msgspec.Struct, omit_defaults=True):
    model_name: str
    outputs: list[InferOutput]
    model_version: str | None = None
    id: str | None = None
    parameters: dict[str, Any] = {}


class TensorMetadata(msgspec.Struct):
    name: str
    datatype: str
    shape: list[int]


class ModelMetadata(msgspec.Struct):
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]
    parameters: dict[str, Any] = {}


class V2ErrorBody(msgspec.Struct, frozen=True):
    """Every v2 error answer, as the protocol (and Triton) gives it."""

    error: str


class ServerMetadata(msgspec.Struct):
    name: str
    version: str
    extensions: list[str]


class ServerLiveness(msgspec.Struct):
    live: bool


class ServerReadiness(msgspec.Struct):
    ready: bool


class ModelReadiness(msgspec.Struct):
    name: str
    ready: bool


# --- probes and administration -------------------------------------------------------------------------


class Health(msgspec.Struct):
    status: str


class Readiness(msgspec.Struct, omit_defaults=True):
    """``GET /ready``: 200 with the models served, or 503 with the reason."""

    status: Annotated[str, Meta(description="'ready' or 'not ready'")]
    models: list[str] | None = None
    reason: str | None = None


class Reloaded(msgspec.Struct):
    status: str
    models: list[str]
    default: Annotated[
        str | None, Meta(description="the model a request naming none asks; null: such requests are refused")
    ]


# Every wire type the OpenAPI schema documents (its components are generated from these).
DOCUMENTED = (
    PredictRequest,
    PredictResponse,
    ErrorBody,
    InferRequest,
    InferResponse,
    ModelMetadata,
    V2ErrorBody,
    ServerMetadata,
    ServerLiveness,
    ServerReadiness,
    ModelReadiness,
    Health,
    Readiness,
    Reloaded,
)
