"""The inference routes are answered ahead of FastAPI's stack (:class:`service.api.direct.DirectRoutes`),
with exactly the answers FastAPI would give: the same statuses, bodies and headers, errors and API key
included; every other request reaches the FastAPI app."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import re
from pathlib import Path

import httpx
import pytest

from service import v1, v2
from service.api.direct import DirectRoutes
from service.api.routes import DIRECT
from service.app import create_app
from service.settings import Settings
from tests.service.conftest import serving
from tests.service.test_hardening import HANDWRITTEN, random_samples
from tests.service.test_service import HANDWRITTEN_DIMS

PREDICT = {"samples": random_samples(3)}
TENSORS = {
    "inputs": [
        {"name": view, "datatype": "FP32", "shape": [2, dim], "data": [0.25] * (2 * dim)}
        for view, dim in HANDWRITTEN_DIMS.items()
    ]
}
JSON = {"Content-Type": "application/json"}
TOKEN = {"Authorization": "Bearer k"}

# (method, path, body, headers, the status FastAPI answers): successes and every kind of error.
REQUESTS = [
    ("POST", "/predict", json.dumps(PREDICT).encode(), JSON, 200),
    ("POST", "/predict", json.dumps({**PREDICT, "method": "cbf", "coverage": 0.8}).encode(), JSON, 200),
    ("POST", "/v1/models/cub/predict", b'{"samples": [{"views": {"nope": [1.0]}}]}', JSON, 400),
    ("POST", "/v1/models/nope/predict", json.dumps(PREDICT).encode(), JSON, 404),
    ("POST", "/predict", b"{not json", JSON, 400),
    ("POST", "/predict", json.dumps(PREDICT).encode(), {"Content-Type": "text/plain"}, 415),
    ("POST", "/predict", json.dumps({"samples": random_samples(9)}).encode(), JSON, 413),  # max_samples 8
    (
        "POST",
        "/predict",
        gzip.compress(json.dumps(PREDICT).encode()),
        {**JSON, "Content-Encoding": "gzip"},
        200,
    ),
    (
        "POST",
        "/predict",
        gzip.compress(json.dumps(PREDICT).encode()),
        {**JSON, "Content-Encoding": "x-gzip"},
        200,
    ),
    ("POST", "/predict", json.dumps(PREDICT).encode(), {**JSON, "Content-Encoding": "br"}, 415),
    ("POST", "/v2/models/handwritten/infer", json.dumps(TENSORS).encode(), JSON, 200),
    ("POST", "/v2/models/handwritten/versions/1/infer", json.dumps(TENSORS).encode(), JSON, 200),
    ("POST", "/v2/models/handwritten/versions/7/infer", json.dumps(TENSORS).encode(), JSON, 404),
    ("POST", "/v2/models/handwritten/infer", b'{"inputs": [{"name": "pix"}]}', JSON, 400),
    # Not direct: FastAPI answers these either way (405, 404, a protected GET route).
    ("GET", "/predict", b"", {}, 405),
    ("POST", "/predict/", json.dumps(PREDICT).encode(), JSON, 404),
    ("GET", "/v2/models/handwritten", b"", {}, 200),
]


def answers(app, served, requests, headers=None) -> list[tuple[int, dict, bytes]]:
    """Each request's status, headers and body from ``served`` (the app's lifespan around them)."""

    async def run() -> list[tuple[int, dict, bytes]]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=served)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                got = []
                for method, path, body, sent, _ in requests:
                    sent = {**sent, **(headers or {})}
                    answer = await client.request(method, path, content=body, headers=sent)
                    got.append((answer.status_code, dict(answer.headers), answer.content))
                return got

    return asyncio.run(run())


@pytest.mark.parametrize("api_key", [None, "k"], ids=["open", "api-key"])
def test_direct_answers_equal_fastapis(api_key):
    app = create_app(Settings(model_dir=Path(HANDWRITTEN).parent, max_samples=8, api_key=api_key))
    direct = DirectRoutes(app, DIRECT)
    for headers in ({}, TOKEN) if api_key else ({},):
        through_fastapi = answers(app, app, REQUESTS, headers)
        assert answers(app, direct, REQUESTS, headers) == through_fastapi
        statuses = [status for status, _, _ in through_fastapi]
        if api_key and not headers:  # 401 from inference and model routes alike, before their 405
            routing = {("POST", "/predict/")}  # no route: 404
            assert statuses == [status if (m, p) in routing else 401 for m, p, *_, status in REQUESTS]
        else:
            assert statuses == [status for *_, status in REQUESTS]


class Witness:
    """ASGI middleware that notes the path of every request reaching the FastAPI app's stack."""

    def __init__(self, app, seen: list[str]) -> None:
        self.app, self.seen = app, seen

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            self.seen.append(scope["path"])
        await self.app(scope, receive, send)


def test_only_other_requests_reach_the_fastapi_app():
    app = create_app(Settings(model_dir=Path(HANDWRITTEN).parent))
    seen: list[str] = []
    app.add_middleware(Witness, seen=seen)
    got = answers(app, DirectRoutes(app, DIRECT), REQUESTS)
    assert [status for status, _, _ in got][:2] == [200, 200]
    assert seen == ["/predict", "/predict/", "/v2/models/handwritten"]  # GET /predict: FastAPI's 405


BUG = "internal error; see the service log"


@pytest.mark.parametrize(
    ("codec", "path", "body", "error"),
    [
        (v1, "/predict", PREDICT, {"type": "internal_error", "message": BUG}),
        (v2, "/v2/models/handwritten/infer", TENSORS, BUG),
    ],
    ids=["v1", "v2"],
)
def test_a_bug_in_an_inference_route_is_a_logged_500_in_its_protocols_format(
    codec, path, body, error, monkeypatch, caplog
):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(codec, "encode", broken)
    with serving(Path(HANDWRITTEN)) as url, caplog.at_level(logging.ERROR, logger="dbf.errors"):
        before = internal_errors(url)
        answer = httpx.post(url + path, json=body)
        assert answer.status_code == 500
        assert answer.json() == {"error": error}
        assert httpx.post(url + "/predict", json={"samples": []}).status_code == 400  # the service goes on
        assert internal_errors(url) == before + 1
    [record] = [r for r in caplog.records if r.getMessage() == "unexpected error"]
    assert record.exc_info[1].args == ("a bug",)


def internal_errors(url: str) -> float:
    metrics = httpx.get(url + "/metrics").text
    return float(re.search(r'^dbf_errors_total\{reason="internal_error"\} (\S+)$', metrics, re.M).group(1))
