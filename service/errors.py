"""Domain errors: what went wrong, in the service's terms, with the HTTP status and the reason each maps to.

They know no web framework (:mod:`service.api.errors` renders them, in the error format of the protocol the
request spoke) and no protocol: an error the core finds in a request's data (a sample's features that
overflow a head, say) carries the sample and view it is about, and each codec words the place in its own
grammar (``samples[3].views.pix`` for v1, ``inputs[0] (pix): row 3`` for v2).
"""

from __future__ import annotations

# Every reason an error response can carry (metric series are created for each at start-up).
REASONS = (
    "invalid_input",
    "payload_too_large",
    "unsupported_media_type",
    "model_not_found",
    "not_ready",
    "overloaded",
    "unauthorized",
    "forbidden",
    "reload_failed",
    "request_timeout",
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


class ModelFault(ServiceError):
    """The model gave what no working model gives (a head's negative evidence, or another number of rows
    than it was sent): no fault of the request's, and no bug of the service's; its operator must replace
    the model."""


class InvalidInput(ServiceError):
    """The request is wrong. ``sample`` and ``view`` (indices in the request and the model's views) say
    where, when the core found it; the protocol's codec then words the place (:meth:`located`)."""

    status, type = 400, "invalid_input"

    def __init__(
        self,
        message: str,
        *,
        sample: int | None = None,
        view: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message, headers=headers)
        self.sample, self.view = sample, view

    def located(self, where: str) -> InvalidInput:
        """The same error, its message prefixed with ``where`` (a place in the protocol's own grammar)."""
        return InvalidInput(f"{where}: {self.message}", headers=self.headers)


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


class Forbidden(ServiceError):
    """Not for this client, whatever it sends (an admin endpoint called from another host, with no key)."""

    status, type = 403, "forbidden"


class ReloadFailed(ServiceError):
    """The new model repository did not verify or load; the previous one is still served."""

    status, type = 409, "reload_failed"


class RequestTimeout(ServiceError):
    """The body did not arrive in time (too slow, or stalled)."""

    status, type = 408, "request_timeout"
