"""Fuzzing the running service: schemathesis from its own OpenAPI schema, and hand-written mutations of
valid bodies. Whatever arrives, the answer is a 2xx or a 4xx in the one error format, never a 5xx."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from service.app import create_app
from service.settings import Settings
from tests.service.conftest import read_one, serving
from tests.service.test_hardening import HANDWRITTEN, random_samples

VALID = {"samples": random_samples(2), "method": "dbf", "lambda": 1.0}
ERROR_STATUSES = {400, 404, 405, 413, 415}


@pytest.fixture(scope="module")
def url():
    # Low limits, so that fuzzed bodies reach them too.
    with serving(Path(HANDWRITTEN), max_samples=8, max_body_bytes=256 * 1024) as base:
        yield base


CONFORMANCE = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


async def served_schema() -> dict:
    """The app's own schema, as /openapi.json serves it once its models are loaded: its predict example is
    then a working body, which schemathesis's coverage phase breaks one field at a time."""
    app = create_app(Settings(model_dir=Path(HANDWRITTEN), log_level="warning"))
    async with app.router.lifespan_context(app):
        return app.openapi()


# A body that breaks the schema is refused with any of the error statuses: 413 too, for one over the low
# limits above, whatever else is wrong with it (schemathesis expects a 400-like status by default).
schema = schemathesis.openapi.from_dict(
    asyncio.run(served_schema()),
    config=SchemathesisConfig.from_dict(
        {"checks": {"negative_data_rejection": {"expected-statuses": sorted(ERROR_STATUSES)}}}
    ),
)


@schema.parametrize()
@settings(max_examples=60, suppress_health_check=list(HealthCheck))
def test_every_answer_is_documented_and_none_is_5xx(case, url):
    """Whatever schemathesis sends, the answer is no 5xx, and its status, media type and body are the ones
    the schema documents for that route (errors in the error body of the route's protocol); a request the
    schema does not allow is refused (negative_data_rejection)."""
    response = case.call_and_validate(base_url=url, timeout=30, checks=CONFORMANCE)
    assert response.status_code < 500, (case.method, case.path, case.body, response.text)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


@st.composite
def mutated_bodies(draw) -> bytes:
    """A valid body with one or more things wrong: a value replaced, a key dropped or renamed (unicode
    too), a list lengthened or shortened, a field added, deep nesting, odd numbers, duplicate keys, or the
    text truncated."""
    body = json.loads(json.dumps(VALID))
    for _ in range(draw(st.integers(1, 3))):
        if not isinstance(body, dict):  # replaced by a non-object: nothing left to mutate inside
            break
        samples = body.get("samples")
        sample = (
            samples[draw(st.integers(0, len(samples) - 1))] if isinstance(samples, list) and samples else {}
        )
        views = sample.get("views") if isinstance(sample, dict) else None
        view = draw(st.sampled_from(sorted(views))) if isinstance(views, dict) and views else None
        # The view's list (possibly emptied by an earlier resize), or None: no view, or an "extra" mutation
        # replaced the views by arbitrary JSON.
        values = views[view] if view and isinstance(views[view], list) else None
        kind = draw(
            st.sampled_from(["replace", "drop", "rename", "resize", "extra", "nest", "number", "top", "many"])
        )
        if kind == "replace" and values:
            values[draw(st.integers(0, len(values) - 1))] = draw(JSON_VALUES)
        elif kind == "replace" and view is None:
            body["samples"] = draw(JSON_VALUES)
        elif kind == "drop":
            target = draw(st.sampled_from(["samples", "method", "lambda", "views", "view"]))
            if target == "views" and isinstance(sample, dict):
                sample.pop("views", None)
            elif target == "view" and view:
                views.pop(view)
            else:
                body.pop(target, None)
        elif kind == "rename" and view:
            views[draw(st.text(min_size=1, max_size=6))] = views.pop(view)
        elif kind == "resize" and values is not None:
            views[view] = values[: draw(st.integers(0, len(values) + 3))] + [0.5] * draw(st.integers(0, 3))
        elif kind == "extra":
            (sample if isinstance(sample, dict) and draw(st.booleans()) else body)[
                draw(st.text(max_size=6))
            ] = draw(JSON_VALUES)
        elif kind == "nest" and view:
            views[view] = json.loads("[" * 50 + "1.0" + "]" * 50)
        elif kind == "top":
            body = draw(JSON_VALUES)
        elif kind == "many":
            body["samples"] = random_samples(draw(st.integers(9, 12)))  # over DBF_MAX_SAMPLES
        elif kind == "number" and values:
            values[0] = "@NUMBER@"
    text = json.dumps(body, allow_nan=True)
    number = draw(st.sampled_from(["1e999", "-1e400", "9" * 400, "NaN", "Infinity", "1e39", "-0", "4e38"]))
    text = text.replace('"@NUMBER@"', number)
    if draw(st.booleans()) and text.startswith('{"samples"'):  # a duplicate key, spelt plainly or escaped
        key = draw(st.sampled_from(['"samples"', '"\\u0073amples"']))
        text = "{" + key + ": [], " + text[1:]
    if draw(st.integers(0, 9)) == 0:
        text = text[: draw(st.integers(0, len(text)))]
    return text.encode()


@given(body=mutated_bodies())
@settings(max_examples=300, suppress_health_check=list(HealthCheck))
def test_mutated_bodies_get_a_clear_4xx(url, body):
    response = httpx.post(url + "/predict", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 200 or response.status_code in ERROR_STATUSES, (body[:300], response.text)
    if response.status_code != 200:
        error = response.json()["error"]
        assert error["type"] != "internal_error" and error["message"]


def test_deep_and_odd_json_is_a_4xx(url):
    headers = {"content-type": "application/json"}
    for raw in (
        b"[" * 100_000,
        b'{"samples": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        '{"samples": [{"views": {"pïx\u2028": [1.0]}}]}'.encode(),
        b'{"samples": [{"views": {"\xff": [1.0]}}]}',  # not UTF-8
        b'\xef\xbb\xbf{"samples": []}',
    ):
        response = httpx.post(url + "/predict", content=raw, headers=headers)
        assert response.status_code == 400, (raw[:60], response.text)


# --- request heads -----------------------------------------------------------------------------------------
# Framing and the v2 header are issue 17's point 1 (parsed defensively where they are read); here: any other
# header field, however odd its name or value, its count or its size.
FRAMING = {
    b"content-length",
    b"transfer-encoding",
    b"inference-header-content-length",
    b"connection",
    b"host",
}
TOKEN = st.text(
    alphabet="!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", min_size=1
)
FIELD_NAMES = (TOKEN.map(str.encode) | st.binary(min_size=1, max_size=12)).filter(
    lambda name: name.strip().lower() not in FRAMING
)
FIELD_VALUES = (
    st.binary(max_size=40)
    | st.text(max_size=40).map(lambda text: text.encode("utf-8"))
    | st.sampled_from(
        [
            b"",
            b" ",
            b"\t",
            b"a" * 40_000,
            "é".encode("latin-1"),
            b"\x00",
            b"1\r\nX-Injected: 1",
            b"\r\n\r\nGET / HTTP/1.1",
        ]
    )
)
BODY = json.dumps(VALID).encode()


@given(
    target=st.sampled_from([b"GET /health", b"GET /v1/models", b"POST /predict"]),
    fields=st.lists(st.tuples(FIELD_NAMES, FIELD_VALUES), max_size=120),
)
@settings(max_examples=150, suppress_health_check=list(HealthCheck), deadline=None)
def test_odd_header_fields_get_an_answer_never_a_5xx(url, target, fields):
    """Whatever the header fields, the answer is a 2xx, or a 4xx in the error format (a malformed head
    included: 400 malformed_request); never a 5xx, a hang or a dropped connection."""
    import socket

    body = BODY if target.startswith(b"POST") else b""
    head = target + b" HTTP/1.1\r\nHost: fuzz\r\nContent-Type: application/json\r\n"
    head += b"".join(name + b": " + value + b"\r\n" for name, value in fields)
    head += b"Content-Length: %d\r\n\r\n" % len(body)
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=15) as conn:
        conn.sendall(head + body)
        answer = read_one(conn)
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 "), (head[:300], answer[:300])
    status = int(status_line.split()[1])
    assert status < 500, (head[:300], answer[:500])
    if status >= 400:
        error = json.loads(rest.partition(b"\r\n\r\n")[2])["error"]
        assert set(error) == {"type", "message"} and error["type"] != "internal_error", error
