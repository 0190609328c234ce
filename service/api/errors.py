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
from service.api.body import BodyRefusedByServer
from service.errors import ServiceError

log = logging.getLogger("dbf.errors")

V2_PREFIX = "/v2"


def error_response(
    path: str, status: int, type_: str, message: str, headers: dict[str, str] | None = None
) -> Response:
    """The error answer in the protocol of a request for ``path``, counted by reason."""
    body = error_body(path, type_, message)
    return Response(body, status_code=status, headers=headers, media_type="application/json")


def error_body(path: str, type_: str, message: str) -> bytes:
    """The JSON error body in the protocol of a request for ``path`` (any other for ""), counted by reason:
    for :func:`error_response`, and for the answers the server writes itself (:mod:`service.server`)."""
    metrics.ERRORS.labels(reason=type_).inc()
    if path.startswith(V2_PREFIX):
        return orjson.dumps({"error": message})
    return orjson.dumps({"error": {"type": type_, "message": message}})


def answer(path: str, error: Exception) -> Response:
    """The answer to ``error``, raised serving a request for ``path``: the one mapping from exceptions to
    responses, for FastAPI's exception handlers (:func:`install`) and for the routes served ahead of them
    (:class:`service.api.direct.DirectRoutes`)."""
    if isinstance(error, ServiceError):
        return error_response(path, error.status, error.type, error.message, error.headers)
    if isinstance(error, RequestValidationError):
        first = error.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ()))
        return error_response(path, 400, "invalid_input", f"{where}: {first.get('msg', 'invalid')}")
    if isinstance(error, BodyRefusedByServer):
        return Response(status_code=400)  # nobody reads it: the server answered and counted its refusal
    if isinstance(error, ClientDisconnect):
        # The client left before sending its whole body: nobody reads this answer (499, as nginx logs it),
        # but it is counted, and it is no bug of ours.
        return error_response(path, 499, "client_disconnected", "client disconnected before sending the body")
    if isinstance(error, HTTPException):
        type_ = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code, "http_error")
        message = _no_route(path) if error.status_code == 404 else str(error.detail)
        return error_response(path, error.status_code, type_, message, error.headers)
    # A bug, never an input's fault: log it once with its traceback, count it, answer in the one format.
    log.error("unexpected error", exc_info=error)
    return error_response(path, 500, "internal_error", "internal error; see the service log")


def _no_route(path: str) -> str:
    """A 404 of the router's: what is served instead (Triton's clients ask for its extensions' routes)."""
    shown = path if len(path) <= 100 else f"{path[:100]}..."
    return (
        f"no endpoint {shown}: the endpoints are listed at /docs and /openapi.json (Triton's extensions: "
        "model configuration, statistics, repository, shared memory, are not implemented)"
    )


def install(app: FastAPI) -> None:
    """Map domain errors, request-validation errors, routing errors and bugs to the protocols' error
    formats (:func:`answer`)."""

    async def handle(request: Request, error: Exception) -> Response:
        return answer(_path(request), error)

    for raised in (ServiceError, RequestValidationError, ClientDisconnect, HTTPException, Exception):
        app.add_exception_handler(raised, handle)


def _path(request: Request) -> str:
    return request.scope.get("path", "")
