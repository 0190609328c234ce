"""Inference, for every protocol through one route function (:func:`serve`): find the model, let the codec
refuse what it cannot take, read the body, take a slot, decode, infer, encode. The v1 routes are here; the
Open Inference Protocol's are in :mod:`service.api.routes.open_inference`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from fastapi import APIRouter, Request
from fastapi.responses import Response

from service import v1
from service.api.body import Received
from service.api.direct import DirectRoute
from service.api.openapi import documented, ok, ref
from service.dataplane import INLINE_ANSWER_VALUES, INLINE_BODY_BYTES, DataPlane
from service.errors import InvalidInput
from service.inference import InferenceRequest, ModelSignature, Result

router = APIRouter(tags=["inference"], route_class=DirectRoute)


class Codec(Protocol):
    """A protocol's wire format over the core (:mod:`service.v1`, :mod:`service.v2`)."""

    def accept(self, headers: Mapping[str, str]) -> None: ...

    def decode(
        self, body: bytes, headers: Mapping[str, str], signature: ModelSignature, *, max_samples: int
    ) -> tuple[InferenceRequest, Any]: ...

    def encode(self, context: Any, result: Result) -> tuple[bytes, dict[str, str]]: ...

    def locate(self, error: InvalidInput, context: Any) -> InvalidInput: ...


async def serve(request: Request, codec: Codec, name: str | None, version: str | None = None) -> Response:
    """One inference request in ``codec``'s protocol, for the model ``name`` (the default for None)."""
    plane: DataPlane = request.app.state.dataplane
    model = plane.model(name, version)
    codec.accept(request.headers)
    # The slot is taken once the body is in: a slow upload holds its connection, never a predict slot.
    async with Received(request, plane) as body:
        with plane.admitted(model):
            decoded, context = await plane.run(
                codec.decode,
                body,
                request.headers,
                model.signature,
                max_samples=plane.settings.max_samples,
                inline=len(body) <= INLINE_BODY_BYTES,
            )
            try:
                result = await plane.infer(model, decoded)
            except InvalidInput as error:
                if error.sample is None:
                    raise
                raise codec.locate(error, context) from None
            answer_values = len(result) * model.values_per_sample
            content, headers = await plane.run(
                codec.encode, context, result, inline=answer_values <= INLINE_ANSWER_VALUES
            )
    return Response(content, headers=headers)


PREDICT = {
    "openapi_extra": {
        "requestBody": {"required": True, "content": {"application/json": {"schema": ref("PredictRequest")}}}
    },
    "response_class": Response,
    **documented(ok("PredictResponse"), 400, 404, 408, 413, 415, 503),
}


@router.post("/predict", **PREDICT)
async def predict_default(request: Request) -> Response:
    """Fuse the views of each sample with the default model; see ``/v1/models/{name}/predict``."""
    return await serve(request, v1, None)


@router.post("/v1/models/{name}/predict", **PREDICT)
async def predict_named(name: str, request: Request) -> Response:
    """Per sample: the fused prediction, its uncertainty, the conflict matrix between views, each view's
    discount, the calibrated ``high_conflict`` flag and the view most to blame when flagged."""
    return await serve(request, v1, name)
