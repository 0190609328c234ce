"""Domain errors and their HTTP mapping, in one place: every error response is
``{"error": {"type": ..., "message": ...}}`` with the status of its type."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from service import metrics


class ServiceError(Exception):
    status = 500
    type = "internal_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidInput(ServiceError):
    status, type = 400, "invalid_input"


class PayloadTooLarge(ServiceError):
    status, type = 413, "payload_too_large"


class ModelNotFound(ServiceError):
    status, type = 404, "model_not_found"


class NotReady(ServiceError):
    status, type = 503, "not_ready"


def error_response(status: int, type_: str, message: str) -> JSONResponse:
    metrics.ERRORS.labels(reason=type_).inc()
    return JSONResponse({"error": {"type": type_, "message": message}}, status_code=status)


def install(app: FastAPI) -> None:
    """Map domain errors, request-validation errors and routing errors to the one error format."""

    @app.exception_handler(ServiceError)
    async def _domain(_: Request, error: ServiceError) -> JSONResponse:
        return error_response(error.status, error.type, error.message)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ()))
        return error_response(400, "invalid_input", f"{where}: {first.get('msg', 'invalid')}")

    @app.exception_handler(HTTPException)
    async def _http(_: Request, error: HTTPException) -> JSONResponse:
        type_ = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code, "http_error")
        return error_response(error.status_code, type_, str(error.detail))
