"""The Python client against the real service."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import numpy as np
import pytest

from service.client import AsyncClient, Client, DBFError, Prediction
from tests.service.conftest import MODELS, serving

CUB = {"image": np.zeros(1024, np.float32), "text": np.zeros(300)}


@pytest.fixture(scope="module")
def url():
    with serving(MODELS / "cub") as base:
        yield base


def test_sync_client(url):
    with Client(url) as client:
        assert client.ready()
        assert client.models()["default"] == "cub"
        p = client.predict(CUB, method="gbaf")
        assert isinstance(p, Prediction)
        assert p.class_name in client.models()["models"][0]["classes"]
        assert set(p.views) == {"image", "text"} and 0 <= p.uncertainty <= 1
        result = client.predict_batch([CUB, {"text": [0.1] * 300}], model="cub", lam=3.0)
        assert (result.model, result.method, result.lam, len(result.predictions)) == ("cub", "dbf", 3.0, 2)
        assert result.predictions[1].conflict[0] is None and set(result.predictions[1].discount) == {"text"}
        with pytest.raises(DBFError) as error:
            client.predict({"image": [0.0] * 3})
        assert (
            error.value.status == 400
            and "samples[0].views.image: expected 1024 values" in error.value.message
        )
        with pytest.raises(DBFError, match="404 model_not_found"):
            client.predict(CUB, model="nope")


def test_a_view_given_as_none_or_all_nan_is_sent_as_missing(url):
    """As fit's data marks a missing view (a row of NaN), or None: the client leaves the view out, which is
    how the service takes a missing view. Before, None raised a TypeError in the client and NaN a 400."""
    with Client(url) as client:
        text_only = client.predict({"text": CUB["text"]})
        for missing in (None, np.full(1024, np.nan), [float("nan")] * 1024):
            answer = client.predict({"image": missing, "text": CUB["text"]})
            assert set(answer.views) == {"text"} and answer.probability == text_only.probability
        with pytest.raises(DBFError, match="image\\[0\\]: every value must be a number, got null"):
            client.predict({"image": [float("nan")] + [0.0] * 1023, "text": CUB["text"]})  # not all NaN


def test_async_client(url):
    async def scenario():
        async with AsyncClient(url) as client:
            assert await client.ready()
            results = await asyncio.gather(*(client.predict(CUB) for _ in range(8)))
            assert len({p.label for p in results}) == 1  # same input, same answer, concurrently

    asyncio.run(scenario())


def test_the_client_and_the_v2_codec_need_numpy_httpx_and_msgspec_only():
    """A client's environment has no server: importing the client and the v2 codec (and using the latter)
    must not need onnxruntime, prometheus-client, the web framework, pydantic or the fusion package."""
    server_side = (
        "onnxruntime", "prometheus_client", "fastapi", "starlette", "uvicorn", "anyio", "pydantic",
        "pydantic_settings", "orjson", "simdjson", "array_api_compat", "torch", "fusion", "manifest",
    )  # fmt: skip
    script = f"""
import sys

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {server_side!r}:
            raise ImportError(f"a client must not need {{name}}")

sys.meta_path.insert(0, Refuse())
import numpy as np
from service.client import AsyncClient, Client, Prediction
from service.v2 import decode_response, encode_request
body, headers = encode_request({{"mor": np.zeros((2, 6), np.float32)}})
answer = b'{{"outputs": [{{"name": "label", "datatype": "INT64", "shape": [2], "data": [1, 2]}}]}}'
assert decode_response(answer, {{}})["label"].tolist() == [1, 2]
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
