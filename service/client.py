"""Python client for dbf-serve (httpx), sync and async, returning typed results. For example::

from service.client import Client

with Client("http://127.0.0.1:8000") as client:
    p = client.predict({"pix": pix_features, "fou": fou_features})  # lists or numpy arrays
    print(p.class_name, p.uncertainty, p.high_conflict, p.blamed_view, p.discount)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

Features = Mapping[str, Sequence[float]]  # view name -> raw features (lists or numpy arrays)


@dataclass(frozen=True)
class ViewOpinion:
    belief: list[float]
    uncertainty: float


@dataclass(frozen=True)
class Prediction:
    """One sample's answer; ``conflict`` rows and columns are None for views the sample lacked."""

    label: int
    class_name: str
    probability: list[float]
    belief: list[float]
    uncertainty: float
    conflict: list[list[float | None] | None]
    discount: dict[str, float]
    high_conflict: bool
    blamed_view: str | None
    views: dict[str, ViewOpinion]


@dataclass(frozen=True)
class PredictResult:
    model: str
    method: str
    lam: float
    views: list[str]
    predictions: list[Prediction]


class DBFError(Exception):
    """An error answer of the service: ``status`` (HTTP), ``type`` and ``message`` from its error body."""

    def __init__(self, status: int, type_: str, message: str) -> None:
        super().__init__(f"{status} {type_}: {message}")
        self.status, self.type, self.message = status, type_, message


def _body(samples: Sequence[Features], method: str | None, lam: float | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "samples": [
            {"views": {name: (v.tolist() if hasattr(v, "tolist") else list(v)) for name, v in s.items()}}
            for s in samples
        ]
    }
    if method is not None:
        body["method"] = method
    if lam is not None:
        body["lambda"] = lam
    return body


def _path(model: str | None) -> str:
    return "/predict" if model is None else f"/v1/models/{model}/predict"


def _checked(response: httpx.Response) -> Any:
    if response.is_success:
        return response.json()
    try:
        error = response.json()["error"]
        raise DBFError(response.status_code, error["type"], error["message"])
    except (ValueError, KeyError, TypeError):
        raise DBFError(response.status_code, "http_error", response.text) from None


_PREDICTION_FIELDS = set(Prediction.__dataclass_fields__) - {"views"}


def _result(payload: dict[str, Any]) -> PredictResult:
    # Fields the service adds later are ignored: an older client keeps working.
    predictions = [
        Prediction(
            **{k: v for k, v in p.items() if k in _PREDICTION_FIELDS},
            views={
                name: ViewOpinion(belief=o["belief"], uncertainty=o["uncertainty"])
                for name, o in p["views"].items()
            },
        )
        for p in payload["predictions"]
    ]
    return PredictResult(
        payload["model"], payload["method"], payload["lambda"], payload["views"], predictions
    )


class Client:
    """Synchronous client. ``predict`` takes one sample's views; ``predict_batch`` many."""

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
    ) -> Prediction:
        return self.predict_batch([views], model=model, method=method, lam=lam).predictions[0]

    def predict_batch(
        self,
        samples: Sequence[Features],
        *,
        model: str | None = None,
        method: str | None = None,
        lam: float | None = None,
    ) -> PredictResult:
        return _result(_checked(self._http.post(_path(model), json=_body(samples, method, lam))))

    def models(self) -> dict[str, Any]:
        return _checked(self._http.get("/v1/models"))

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
    ) -> Prediction:
        return (await self.predict_batch([views], model=model, method=method, lam=lam)).predictions[0]

    async def predict_batch(
        self,
        samples: Sequence[Features],
        *,
        model: str | None = None,
        method: str | None = None,
        lam: float | None = None,
    ) -> PredictResult:
        return _result(_checked(await self._http.post(_path(model), json=_body(samples, method, lam))))

    async def models(self) -> dict[str, Any]:
        return _checked(await self._http.get("/v1/models"))

    async def ready(self) -> bool:
        return (await self._http.get("/ready")).status_code == 200

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()
