"""Application wiring. Until the inference routes land, the service answers liveness and readiness only."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse


def create_app() -> FastAPI:
    app = FastAPI(title="dbf-serve", version="0.1.0")

    @app.get("/health", tags=["probes"])
    def health() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get("/ready", tags=["probes"])
    def ready() -> JSONResponse:
        """Readiness: 200 once every model is loaded and verified. No model loading exists yet, so 503."""
        return JSONResponse({"status": "not ready", "reason": "no models are loaded"}, status_code=503)

    return app


app = create_app()
