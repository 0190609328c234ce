"""The service's one configuration object, read from ``DBF_*`` environment variables and the CLI."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Settings; every field can be set as ``DBF_<NAME>`` (e.g. ``DBF_PORT=9000``)."""

    model_config = SettingsConfigDict(env_prefix="DBF_")

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    workers: int = Field(default=1, ge=1)
    model_dir: Path = Path("models")
    log_level: str = "info"
