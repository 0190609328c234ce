"""The body limit sized by the models (issue 27): unless DBF_MAX_BODY_BYTES is set, DBF_MAX_SAMPLES samples
of the largest model served fit in one request, in binary and in JSON with every number written at full
length; set, it is the limit."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import httpx
import numpy as np
import pytest

from service import v2
from service.repository import load_repository
from service.settings import Settings
from tests.service.conftest import serving
from tests.service.test_request_limits import cub_with_linear_heads

# The sample size of the MLP benchmark model (views of 512, 1024 and 768 features): CUB's image view
# and a text view widened to make 2,304 features a sample (9.4 MB as 1024 binary samples, over 8 MiB).
WIDE_DIMS = {"image": 1024, "text": 1280}
SAMPLES = 1024  # DBF_MAX_SAMPLES's default
# A float32 written at full length as JSON (what a client writing float64 digits may send), 23 characters.
LONGEST = "-1.2345678901234567e-05"


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> Path:
    pytest.importorskip("onnx")
    return cub_with_linear_heads(tmp_path_factory.mktemp("models") / "wide", WIDE_DIMS)


def longest_json(samples: int) -> bytes:
    """``samples`` v1 samples of the wide model, every feature written as :data:`LONGEST`."""
    sample = json.dumps({"views": {v: "@" * d for v, d in WIDE_DIMS.items()}})
    for d in WIDE_DIMS.values():
        sample = sample.replace('"' + "@" * d + '"', "[" + ", ".join([LONGEST] * d) + "]", 1)
    return ('{"samples": [' + ", ".join([sample] * samples) + "]}").encode()


def binary(samples: int) -> tuple[bytes, dict[str, str]]:
    rng = np.random.default_rng(samples)
    return v2.encode_request({v: rng.random((samples, d), dtype=np.float32) for v, d in WIDE_DIMS.items()})


def test_the_largest_request_of_a_wide_model_fits_in_json_and_binary(wide):
    body = longest_json(SAMPLES)
    assert len(body) > 56 << 20  # 7 times the former default limit (8 MiB)
    with serving(wide) as url:
        answer = httpx.post(
            url + "/v1/models/wide/predict",
            content=body,
            headers={"content-type": "application/json"},
            timeout=120,
        )
        assert answer.status_code == 200, answer.text[:300]
        assert len(answer.json()["predictions"]) == SAMPLES
        content, headers = binary(SAMPLES)
        answer = httpx.post(url + "/v2/models/wide/infer", content=content, headers=headers, timeout=60)
        assert answer.status_code == 200, answer.text[:300]
        # The limit holds requests of DBF_MAX_SAMPLES samples, not more: one more sample is a 413.
        content, headers = binary(SAMPLES + 1)
        answer = httpx.post(url + "/v2/models/wide/infer", content=content, headers=headers, timeout=60)
        assert answer.status_code == 413 and "at most 1024" in answer.json()["error"]


def test_a_set_body_limit_wins_over_the_models(wide):
    content, headers = binary(SAMPLES)
    with serving(wide, max_body_bytes=8 << 20) as url:
        answer = httpx.post(url + "/v2/models/wide/infer", content=content, headers=headers, timeout=60)
        assert answer.status_code == 413
        assert f"at most {8 << 20} are accepted (DBF_MAX_BODY_BYTES)" in answer.json()["error"]
    with serving(wide, max_samples=2048) as url:  # the limit follows DBF_MAX_SAMPLES too
        content, headers = binary(2048)
        answer = httpx.post(url + "/v2/models/wide/infer", content=content, headers=headers, timeout=60)
        assert answer.status_code == 200, answer.text[:300]


def test_a_body_limit_past_the_body_budget_is_said_at_load(wide, monkeypatch, caplog):
    """Bodies the limit takes but the body budget cannot hold would be refused (413) for ever: said, with
    the model and how many samples fit (it said 503, and named neither: a 20,000-feature model's 400 JSON
    samples, 164 MB, were a 413 that nothing at load had foretold)."""
    monkeypatch.setattr(logging.getLogger("dbf"), "propagate", True)  # to caplog, as service.app stops it
    repository = load_repository(Settings(model_dir=wide, body_memory_bytes=32 << 20))
    assert repository.max_body_bytes > 32 << 20
    assert (
        "are taken (DBF_MAX_BODY_BYTES) but 33554432 are held at once (DBF_BODY_MEMORY_BYTES)" in caplog.text
    )
    per_sample = sum(d * 26 + len(v) + 8 for v, d in WIDE_DIMS.items()) + 16  # every number at full length
    fit = ((32 << 20) - 65536) // per_sample
    assert f"larger bodies are refused, 413 ('wide' in JSON past {fit} samples, at full length" in caplog.text
    with serving(wide, body_memory_bytes=32 << 20) as url:  # and 413 is what such a body gets
        answer = httpx.post(
            url + "/v1/models/wide/predict",
            content=longest_json(SAMPLES),
            headers={"content-type": "application/json"},
            timeout=120,
        )
        assert answer.status_code == 413 and "DBF_BODY_MEMORY_BYTES" in answer.text
