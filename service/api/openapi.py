"""The OpenAPI schema, generated: request and response bodies from the wire types (:mod:`service.schemas`,
by msgspec), the model description from the manifest's pydantic model, the fusion methods from
:data:`fusion.METHODS`, and every status a route can answer with its protocol's error body. FastAPI's
validation-error response (422) is left out: bodies are read raw and refused by the codecs with 400."""

from __future__ import annotations

from typing import Any

import msgspec
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from fusion import METHODS
from manifest import Manifest
from service.api.errors import V2_PREFIX
from service.schemas import DOCUMENTED

JSON = "application/json"
# What each error status means, on every route that can answer it.
_STATUS = {
    400: "invalid input; the message says what and where",
    401: "bearer token missing or wrong (DBF_API_KEY)",
    403: "an admin endpoint, called from another host while the service has no DBF_API_KEY",
    404: "no such model (or version)",
    408: "the body did not arrive in time (DBF_BODY_TIMEOUT_SECONDS)",
    409: "the new models failed their checks; the previous ones still serve",
    413: "body over DBF_MAX_BODY_BYTES, or more than DBF_MAX_SAMPLES samples",
    415: "a media type or Content-Encoding this route does not take",
    503: "not ready, or overloaded (with Retry-After)",
}


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def ok(schema: str, description: str = "OK", media_type: str = JSON) -> dict[str, Any]:
    """A 200 answer of the wire type ``schema``."""
    return {"description": description, "content": {media_type: {"schema": ref(schema)}}}


def documented(
    success: dict[str, Any], *statuses: int, v2: bool = False, unavailable: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A route's documentation: ``success`` as 200, each error status with its protocol's error body (or the
    probe's own ``unavailable`` answer as 503); the route's return annotation documents nothing."""
    error = ref("V2ErrorBody" if v2 else "ErrorBody")
    responses: dict[int | str, dict[str, Any]] = {200: success}
    if unavailable is not None:
        responses[503] = unavailable
    for status in statuses:
        responses[status] = {"description": _STATUS[status], "content": {JSON: {"schema": error}}}
    return {"responses": responses, "response_model": None}


def build(app: FastAPI, example: dict[str, Any] | None) -> dict[str, Any]:
    """The schema of ``app``; ``example``: a working predict body for the default model, if one is loaded."""
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)
    _, wire = msgspec.json.schema_components(DOCUMENTED, ref_template="#/components/schemas/{name}")
    components.update(wire)
    components.update(_model_description())
    components["PredictRequest"]["properties"]["method"]["enum"] = list(METHODS)
    components["InferRequest"]["properties"]["parameters"]["properties"]["method"]["enum"] = list(METHODS)
    if example is not None:
        components["PredictRequest"]["example"] = example
    for path, operations in schema["paths"].items():
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)  # nothing is validated by FastAPI: the codecs answer 400
            if "security" in operation:  # guarded by DBF_API_KEY (service.app attaches the check)
                error = ref("V2ErrorBody" if path.startswith(V2_PREFIX) else "ErrorBody")
                responses["401"] = {"description": _STATUS[401], "content": {JSON: {"schema": error}}}
    return schema


def _model_description() -> dict[str, Any]:
    """``ModelDescription`` (a manifest as served, with the provider running each view) and ``ModelListing``,
    from the manifest's own pydantic model."""
    manifest = Manifest.model_json_schema(
        by_alias=True, mode="serialization", ref_template="#/components/schemas/{model}"
    )
    definitions = manifest.pop("$defs", {})
    description = {
        **manifest,
        "title": "ModelDescription",
        "properties": {
            **manifest["properties"],
            "providers": {
                "type": "object",
                "additionalProperties": {"type": "string"},
                "description": "view -> the onnxruntime execution providers running its head",
            },
            "placement": {
                "type": "object",
                "description": "where each batch size runs (DBF_DEVICE), why, and the timings deciding it",
            },
        },
        "required": [*manifest.get("required", []), "providers", "placement"],
    }
    listing = {
        "title": "ModelListing",
        "type": "object",
        "properties": {
            "default": {
                "anyOf": [{"type": "string"}, {"type": "null"}],
                "description": "the model a request naming none asks; null where several are served and "
                "DBF_DEFAULT_MODEL names none of them (such requests are refused)",
            },
            "models": {"type": "array", "items": ref("ModelDescription")},
        },
        "required": ["default", "models"],
    }
    return {**definitions, "ModelDescription": description, "ModelListing": listing}
