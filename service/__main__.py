"""``python -m service --host H --port P [--workers N] [--model-dir DIR]``; defaults from ``DBF_*``."""

from __future__ import annotations

import argparse
from pathlib import Path

import uvicorn

from service.settings import Settings


def main(argv: list[str] | None = None) -> None:
    defaults = Settings()
    parser = argparse.ArgumentParser(prog="python -m service", description=__doc__)
    parser.add_argument("--host", default=defaults.host)
    parser.add_argument("--port", type=int, default=defaults.port)
    parser.add_argument("--workers", type=int, default=defaults.workers)
    parser.add_argument("--model-dir", type=Path, default=defaults.model_dir)
    parser.add_argument("--log-level", default=defaults.log_level)
    args = parser.parse_args(argv)
    settings = Settings(
        host=args.host,
        port=args.port,
        workers=args.workers,
        model_dir=args.model_dir,
        log_level=args.log_level,
    )
    uvicorn.run(
        "service.app:app",
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        log_level=settings.log_level,
    )


if __name__ == "__main__":
    main()
