"""Domain errors and their HTTP mapping, in one place: every error response is
``{"error": {"type": ..., "message": ...}}`` with the status of its type."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from service import metrics

log = logging.getLogger("dbf.errors")

# Every reason an error response can carry (metric series are created for each at start-up).
REASONS = (
    "invalid_input",
    "payload_too_large",
    "unsupported_media_type",
    "model_not_found",
    "not_ready",
    "overloaded",
    "unauthorized",
    "reload_failed",
    "not_found",
    "method_not_allowed",
    "http_error",
    "client_disconnected",
    "internal_error",
    # Answered at the connection level (service/server.py).
    "malformed_request",
    "headers_too_large",
    "uri_too_long",
    "header_timeout",
    "shutting_down",
)


class ServiceError(Exception):
    status = 500
    type = "internal_error"

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers


class InvalidInput(ServiceError):
    status, type = 400, "invalid_input"


class PayloadTooLarge(ServiceError):
    status, type = 413, "payload_too_large"


class UnsupportedMediaType(ServiceError):
    status, type = 415, "unsupported_media_type"


class ModelNotFound(ServiceError):
    status, type = 404, "model_not_found"


class NotReady(ServiceError):
    status, type = 503, "not_ready"


class Overloaded(ServiceError):
    """Load shedding: more requests in flight than the service takes; the client should retry later."""

    status, type = 503, "overloaded"


class Unauthorized(ServiceError):
    status, type = 401, "unauthorized"


class ReloadFailed(ServiceError):
    """The new model repository did not verify or load; the previous one is still served."""

    status, type = 409, "reload_failed"


def error_response(
    status: int, type_: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    metrics.ERRORS.labels(reason=type_).inc()
    return JSONResponse({"error": {"type": type_, "message": message}}, status_code=status, headers=headers)


def install(app: FastAPI) -> None:
    """Map domain errors, request-validation errors and routing errors to the one error format."""

    @app.exception_handler(ServiceError)
    async def _domain(_: Request, error: ServiceError) -> JSONResponse:
        return error_response(error.status, error.type, error.message, error.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ()))
        return error_response(400, "invalid_input", f"{where}: {first.get('msg', 'invalid')}")

    @app.exception_handler(ClientDisconnect)
    async def _gone(_: Request, error: ClientDisconnect) -> JSONResponse:
        # The client left before sending its whole body: nobody reads this answer (499, as nginx logs it),
        # but it is counted, and it is no bug of ours.
        return error_response(499, "client_disconnected", "client disconnected before sending the body")

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, error: Exception) -> JSONResponse:
        # A bug, never an input's fault: log it once with its traceback, count it, answer in the one format.
        log.exception("unexpected error")
        return error_response(500, "internal_error", "internal error; see the service log")

    @app.exception_handler(HTTPException)
    async def _http(_: Request, error: HTTPException) -> JSONResponse:
        type_ = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code, "http_error")
        return error_response(error.status_code, type_, str(error.detail))
