"""The Python client against the real service."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from service.client import AsyncClient, Client, DBFError, Prediction
from tests.service.conftest import running_service

MODELS = Path(__file__).resolve().parents[2] / "models"
CUB = {"image": np.zeros(1024, np.float32), "text": np.zeros(300)}


@pytest.fixture(scope="module")
def url():
    with running_service("--model-dir", str(MODELS / "cub")) as base:
        yield base


def test_sync_client(url):
    with Client(url) as client:
        assert client.ready()
        assert client.models()["default"] == "cub"
        p = client.predict(CUB, method="gbaf")
        assert isinstance(p, Prediction)
        assert p.class_name in client.models()["models"][0]["classes"]
        assert set(p.views) == {"image", "text"} and 0 <= p.uncertainty <= 1
        result = client.predict_batch([CUB, {"text": [0.5] * 300}], model="cub", lam=3.0)
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


def test_async_client(url):
    async def scenario():
        async with AsyncClient(url) as client:
            assert await client.ready()
            results = await asyncio.gather(*(client.predict(CUB) for _ in range(8)))
            assert len({p.label for p in results}) == 1  # same input, same answer, concurrently

    asyncio.run(scenario())
