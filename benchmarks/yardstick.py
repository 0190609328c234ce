"""The yardstick for ``benchmarks.service``: a bare FastAPI endpoint that validates the same request body as
``POST /predict`` with pydantic and returns a constant. Served by the same uvicorn with the same settings.

    uvicorn benchmarks.yardstick:app --port 8001
"""

from __future__ import annotations

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field


class Sample(BaseModel):
    model_config = ConfigDict(extra="forbid")
    views: dict[str, list[float]]


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    samples: list[Sample] = Field(min_length=1, max_length=1024)
    method: str | None = None
    lam: float | None = Field(default=None, alias="lambda", gt=0)


app = FastAPI()
ANSWER = {"ok": True}


@app.post("/predict")
async def predict(request: PredictRequest) -> dict[str, bool]:
    return ANSWER
