"""Optional bearer-token authentication (``DBF_API_KEY``) for predict, model and admin endpoints, and for
the API's documentation (``/openapi.json``, ``/docs``, ``/redoc``: the schema shows the default model's views
and their dimensions).

``/health``, ``/ready`` and ``/metrics`` stay open: probes and scrapers carry no secrets. They reveal the
models' and views' names and the counts of answers, nothing that lets a caller predict or reload (protect
them at the network level where that matters: docs/operations/security.md). The app
attaches the check only when a key is set (:func:`service.app.create_app`): without one there is nothing
to check, nor a dependency to solve on every request, and the OpenAPI schema asks for no token.
A protected route checks the key first, before it says which methods it takes (:class:`ProtectedRoute`).
Admin endpoints without a key answer only clients on this host (:func:`require_local_admin`).
"""

from __future__ import annotations

import hmac
import ipaddress
from typing import Annotated
from urllib.parse import urlsplit

from fastapi import HTTPException, Request, Security
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import SecretStr
from starlette.routing import Match
from starlette.types import Receive, Scope, Send

from service.errors import Forbidden, Unauthorized

# async, so FastAPI runs it on the event loop (a plain def would cost a thread hop per request).
# auto_error=False: the 401 comes from our one error handler, in the one error format.
_BEARER = HTTPBearer(auto_error=False, description="DBF_API_KEY, when the service has one")


TWICE = "Authorization given twice: send one (a proxy and the service could each read another)"


async def require_api_key(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Security(_BEARER)]
) -> None:
    if len(request.headers.getlist("authorization")) > 1:
        raise Unauthorized(TWICE, headers={"WWW-Authenticate": "Bearer"})
    verify_token(None if credentials is None else credentials.credentials, request.app.state.settings.api_key)


def verify_token(token: str | None, key: SecretStr | None) -> None:
    """The one check of a bearer ``token`` (None: none sent) against ``DBF_API_KEY``, for every protocol
    (the gRPC front end reads it from the ``authorization`` metadata: :func:`bearer_token`)."""
    if key is None:
        return
    challenge = {"WWW-Authenticate": "Bearer"}
    if token is None:
        raise Unauthorized("this endpoint needs 'Authorization: Bearer <DBF_API_KEY>'", headers=challenge)
    # Constant time: how long the comparison takes says nothing about how much of the token was right.
    if not hmac.compare_digest(token.encode(), key.get_secret_value().encode()):
        raise Unauthorized("invalid bearer token", headers=challenge)


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` value, read as HTTPBearer reads REST's (the scheme
    in any case, spaces around the token dropped); None for none or another scheme. Spaces around the value
    are dropped too: HTTP's parser drops them from REST's headers, gRPC hands metadata over as sent."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


async def check_api_key(request: Request) -> None:
    """:func:`require_api_key` for the routes that solve no dependencies
    (:class:`service.api.direct.DirectRoute`): the same header parsing, the same check."""
    if request.app.state.settings.api_key is not None:
        await require_api_key(request, await _BEARER(request))


class GetAnswersHead(APIRoute):
    """A route that takes GET answers HEAD too (its GET answer, whose body the server leaves out), as
    Starlette's routes do and FastAPI's do not; the schema documents the GET alone. A method it does not
    take gets 405, whose ``Allow`` says what it does take, HEAD included."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child_scope = super().matches(scope)
        if match is Match.PARTIAL and self._head_of_get(scope):
            return Match.FULL, child_scope
        return match, child_scope

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._head_of_get(scope):
            # Answered as a GET (its dependencies, the key's check among them, included); the server keeps
            # its own scope, a HEAD's, and leaves the body out.
            await super().handle({**scope, "method": "GET"}, receive, send)
            return
        if scope["method"] not in self.methods:
            await self.refuse_method(Request(scope, receive))
        await super().handle(scope, receive, send)

    async def refuse_method(self, request: Request) -> None:
        """The 405 for a method the route does not take."""
        allowed = self.methods | ({"HEAD"} if "GET" in self.methods else set())
        raise HTTPException(405, headers={"Allow": ", ".join(sorted(allowed))})

    def _head_of_get(self, scope: Scope) -> bool:
        return scope["method"] == "HEAD" and "GET" in self.methods


class ProtectedRoute(GetAnswersHead):
    """A route behind ``DBF_API_KEY`` (the routers of :data:`service.api.routes.PROTECTED` declare theirs
    with it). A request for its path with a method it does not take gets 401 without the key, like any
    other: only with the key a 405. (With a method it takes, the key is checked by the router's
    dependency, or by DirectRoute's handler.)
    """

    async def refuse_method(self, request: Request) -> None:
        await check_api_key(request)
        await super().refuse_method(request)


async def require_local_admin(request: Request) -> None:
    """Without ``DBF_API_KEY``, admin endpoints answer only clients on this host (loopback): a reload loads
    every model afresh (CPU, and the memory of a second repository meanwhile), which nobody else who can
    reach the port should be able to call for. With a key, the key guards them (:func:`require_api_key`).

    Behind a proxy on this host, uvicorn takes the client's address from ``X-Forwarded-For``, a header it
    trusts from this host's loopback only (:data:`service.server.LOCAL_PROXIES`); from another loopback
    address (a mesh's sidecar, 127.0.0.6 in Istio) the header stays. Every address that a proxy's header
    names must be local too: ``X-Forwarded-For``'s, RFC 7239's ``Forwarded: for=`` (a proxy may set it
    alone: read as none, it made every client look local) and nginx's ``X-Real-IP``. A proxy that sets none
    of them makes every client look local.

    A browser on this host calls from loopback whatever page it shows: a request naming a page's
    ``Origin`` is taken from this host's pages alone (Swagger UI at /docs). Else any site could have it
    reload, again and again (a POST without a body needs no CORS preflight; DNS rebinding makes the page
    the service's own origin as the browser sees it, not as the ``Origin`` names it).
    """
    if request.app.state.settings.api_key is not None:
        return
    client = request.client.host if request.client is not None else ""
    remote = next((address for address in (client, *_proxied(request)) if not _loopback(address)), None)
    if remote is not None:
        raise Forbidden(
            f"admin endpoints answer only clients on this host (not {remote or 'an unknown client'}) while "
            "the service has no DBF_API_KEY; set one to call them from elsewhere"
        )
    origin = request.headers.get("origin")
    if origin is not None and not _local_origin(origin):
        raise Forbidden(
            f"admin endpoints answer no web page but this host's (not Origin: {origin}) while the service "
            "has no DBF_API_KEY: call them from a script or this host's page, or set a key"
        )


def _local_origin(origin: str) -> bool:
    """Whether a browser's ``Origin`` is a page of this host: its host loopback (an address, or localhost)."""
    try:
        host = urlsplit(origin).hostname
    except ValueError:  # not a URL (an unbalanced bracket)
        return False
    return host is not None and (host == "localhost" or _loopback(host))


def _proxied(request: Request) -> list[str]:
    """The client addresses that proxies name in the request's headers, as they wrote them (an address,
    or whatever else they put there: a name, ``unknown``, an obfuscated ``_node``)."""
    headers = request.headers
    named = [a.strip() for value in headers.getlist("x-forwarded-for") for a in value.split(",")]
    named += [value.strip() for value in headers.getlist("x-real-ip")]
    for value in headers.getlist("forwarded"):
        for pair in (pair for element in value.split(",") for pair in element.split(";")):
            name, _, node = pair.partition("=")
            if name.strip().lower() == "for":
                named.append(_node_address(node.strip().strip('"')))
    return named


def _node_address(node: str) -> str:
    """The address of a ``Forwarded`` node: ``192.0.2.7``, ``192.0.2.7:4711``, ``[2001:db8::7]:4711``."""
    if node.startswith("["):
        return node[1:].partition("]")[0]
    return node.partition(":")[0]


def _loopback(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:  # a name, or nothing: not an address of this host's loopback
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # 127.0.0.1 on a dual-stack socket
    return address.is_loopback
