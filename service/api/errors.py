"""Domain errors to HTTP, in one place: the status of each error type, and the error body of the protocol
the request spoke: ``{"error": {"type": ..., "message": ...}}`` for v1 and the rest, ``{"error": "..."}``
on ``/v2`` (the Open Inference Protocol's, as Triton and its clients expect it)."""

from __future__ import annotations

import logging

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from service import metrics
from service.errors import ServiceError

log = logging.getLogger("dbf.errors")

V2_PREFIX = "/v2"


def error_response(
    path: str, status: int, type_: str, message: str, headers: dict[str, str] | None = None
) -> Response:
    """The error answer in the protocol of a request for ``path``, counted by reason."""
    metrics.ERRORS.labels(reason=type_).inc()
    if path.startswith(V2_PREFIX):
        body = orjson.dumps({"error": message})
    else:
        body = orjson.dumps({"error": {"type": type_, "message": message}})
    return Response(body, status_code=status, headers=headers, media_type="application/json")


def install(app: FastAPI) -> None:
    """Map domain errors, request-validation errors and routing errors to the protocols' error formats."""

    @app.exception_handler(ServiceError)
    async def _domain(request: Request, error: ServiceError) -> Response:
        return error_response(_path(request), error.status, error.type, error.message, error.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, error: RequestValidationError) -> Response:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ()))
        return error_response(_path(request), 400, "invalid_input", f"{where}: {first.get('msg', 'invalid')}")

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, error: ClientDisconnect) -> Response:
        # The client left before sending its whole body: nobody reads this answer (499, as nginx logs it),
        # but it is counted, and it is no bug of ours.
        return error_response(
            _path(request), 499, "client_disconnected", "client disconnected before sending the body"
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, error: Exception) -> Response:
        # A bug, never an input's fault: log it once with its traceback, count it, answer in the one format.
        log.exception("unexpected error")
        return error_response(_path(request), 500, "internal_error", "internal error; see the service log")

    @app.exception_handler(HTTPException)
    async def _http(request: Request, error: HTTPException) -> Response:
        type_ = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code, "http_error")
        return error_response(_path(request), error.status_code, type_, str(error.detail), error.headers)


def _path(request: Request) -> str:
    return request.scope.get("path", "")
