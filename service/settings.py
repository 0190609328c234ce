"""The service's one configuration object, read from ``DBF_*`` environment variables and the CLI."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Every field can be set as ``DBF_<NAME>`` (e.g. ``DBF_PORT=9000``, ``DBF_REQUIRE_GPU=true``)."""

    model_config = SettingsConfigDict(env_prefix="DBF_")

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    workers: int = Field(default=1, ge=1)
    model_dir: Path = Path("models")
    default_model: str = "handwritten"
    max_samples: int = Field(default=1024, ge=1, description="samples per request; more is a 413")
    # 1024 HandWritten samples as JSON take ~13 MB: the default leaves room for that and refuses more early.
    max_body_bytes: int = Field(
        default=32 * 1024 * 1024, ge=1, description="request body size; more is a 413"
    )
    require_gpu: bool = Field(default=False, description="refuse to start unless CUDA really runs the heads")
    # Each view's onnxruntime session gets one thread and no spinning: the heads are small matrix products,
    # a request runs its views one after another in one worker thread, and concurrency comes from running
    # requests in parallel (inference_threads), so per-session pools would only oversubscribe the cores.
    onnx_threads: int = Field(default=1, ge=1)
    inference_threads: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1)
    log_level: str = "info"
    graceful_shutdown_seconds: float = Field(
        default=30.0, gt=0, description="in-flight requests' time to finish"
    )
