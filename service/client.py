"""Python client for dbf-serve's v1 API (httpx), sync and async, returning typed results. For example::

from service.client import Client

with Client("http://127.0.0.1:8000") as client:
    p = client.predict({"pix": pix_features, "fou": fou_features})  # lists or numpy arrays
    print(p.class_name, p.uncertainty, p.high_conflict, p.blamed_view, p.discount)

It needs httpx, msgspec and numpy only (not the server's dependencies): answers are decoded straight into the
wire types of :mod:`service.schemas`, whose ``Prediction`` has a field for every output of the registry
(:mod:`service.outputs`). Fields a newer service adds are ignored, so an older client keeps working. For
tensors, the Open Inference Protocol's clients (tritonclient, kserve) or :mod:`service.v2` speak ``/v2``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import msgspec
import numpy as np

from service.outputs import ViewOpinion
from service.schemas import ErrorBody, Prediction, PredictResponse

# view name -> raw features (lists or numpy arrays); None, or all NaN (a missing view's row in fit's data),
# for a view the sample lacks: left out of what is sent, as the service takes a missing view.
Features = Mapping[str, Sequence[float] | None]
PredictResult = PredictResponse  # model, method, lam, views, predictions

__all__ = ["AsyncClient", "Client", "DBFError", "Prediction", "PredictResult", "ViewOpinion"]

_RESULT = msgspec.json.Decoder(PredictResponse)
_ERROR = msgspec.json.Decoder(ErrorBody)


class DBFError(Exception):
    """An error answer of the service: ``status`` (HTTP), ``type`` and ``message`` from its error body."""

    def __init__(self, status: int, type_: str, message: str) -> None:
        super().__init__(f"{status} {type_}: {message}")
        self.status, self.type, self.message = status, type_, message


def _body(
    samples: Sequence[Features], method: str | None, lam: float | None, coverage: float | None
) -> bytes:
    body: dict[str, Any] = {"samples": [{"views": _views(sample)} for sample in samples]}
    if method is not None:
        body["method"] = method
    if lam is not None:
        body["lambda"] = lam
    if coverage is not None:
        body["coverage"] = coverage
    return msgspec.json.encode(body)


def _views(sample: Features) -> dict[str, list]:
    """A sample's views as JSON lists, those it lacks (None, or every value NaN) left out."""
    views = {}
    for name, values in sample.items():
        if values is None:
            continue
        array = np.asarray(values)
        if array.size and array.dtype.kind == "f" and np.isnan(array).all():
            continue
        views[name] = array.tolist()
    return views


_JSON = {"content-type": "application/json"}


def _path(model: str | None) -> str:
    return "/predict" if model is None else f"/v1/models/{model}/predict"


def _checked(response: httpx.Response) -> bytes:
    if response.is_success:
        return response.content
    try:
        error = _ERROR.decode(response.content).error
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise DBFError(response.status_code, "http_error", response.text) from None
    raise DBFError(response.status_code, error.type, error.message)


class Client:
    """Synchronous client. ``predict`` takes one sample's views; ``predict_batch`` many. ``method`` and
    ``lam`` choose the fusion, ``coverage`` the prediction sets' (the model's defaults when None). A view a
    sample lacks is left out of its mapping, or given as None or as all NaN (as fit's data marks it)."""

    def __init__(
        self, base_url: str = "http://127.0.0.1:8000", *, timeout: float = 30.0, **httpx_options
    ) -> None:
        self._http = httpx.Client(base_url=base_url, timeout=timeout, **httpx_options)

    def predict(
        self,
        views: Features,
        *,
        model: str | None = None,
        method: str | None = None,
        lam: float | None = None,
        coverage: float | None = None,
    ) -> Prediction:
        return self.predict_batch(
            [views], model=model, method=method, lam=lam, coverage=coverage
        ).predictions[0]

    def predict_batch(
        self,
        samples: Sequence[Features],
        *,
        model: str | None = None,
        method: str | None = None,
        lam: float | None = None,
        coverage: float | None = None,
    ) -> PredictResult:
        response = self._http.post(_path(model), content=_body(samples, method, lam, coverage), headers=_JSON)
        return _RESULT.decode(_checked(response))

    def models(self) -> dict[str, Any]:
        return msgspec.json.decode(_checked(self._http.get("/v1/models")))

    def ready(self) -> bool:
        return self._http.get("/ready").status_code == 200

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class AsyncClient:
    """Asynchronous client with the same methods as :class:`Client`, awaited."""

    def __init__(
        self, base_url: str = "http://127.0.0.1:8000", *, timeout: float = 30.0, **httpx_options
    ) -> None:
        self._http = httpx.AsyncClient(base_url=base_url, timeout=timeout, **httpx_options)

    async def predict(
        self,
        views: Features,
        *,
        model: str | None = None,
        method: str | None = None,
        lam: float | None = None,
        coverage: float | None = None,
    ) -> Prediction:
        return (
            await self.predict_batch([views], model=model, method=method, lam=lam, coverage=coverage)
        ).predictions[0]

    async def predict_batch(
        self,
        samples: Sequence[Features],
        *,
        model: str | None = None,
        method: str | None = None,
        lam: float | None = None,
        coverage: float | None = None,
    ) -> PredictResult:
        response = await self._http.post(
            _path(model), content=_body(samples, method, lam, coverage), headers=_JSON
        )
        return _RESULT.decode(_checked(response))

    async def models(self) -> dict[str, Any]:
        return msgspec.json.decode(_checked(await self._http.get("/v1/models")))

    async def ready(self) -> bool:
        return (await self._http.get("/ready")).status_code == 200

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()
