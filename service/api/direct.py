"""The inference routes, served directly: declared in FastAPI like every route (so they are documented in its
OpenAPI schema from their declaration), answered ahead of its middleware and router.

FastAPI's way to an endpoint (its middleware stack: server errors, telemetry, body limit, exceptions, exit
stacks; its router; its request handler) is a sizeable share of a one-sample ``POST /predict``'s CPU, so
bypassing it raises one-sample throughput (measured by ``python -m benchmarks.service --paired``; the figures
are in the docs' benchmarks page). So an inference route is a
:class:`DirectRoute` (its endpoint takes the request and returns the :class:`Response` itself: nothing to
solve, validate or serialize), and :class:`DirectRoutes`, in front of the FastAPI app, answers the requests
that match one; every other request goes on to the app. What the bypassed stack gave these routes is here or
in the route: the API key check (:func:`service.auth.check_api_key`) and the mapping of errors to answers
(:func:`service.api.errors.answer`), the same as FastAPI's exception handlers apply. FastAPI's own
OpenTelemetry instrumentation does not see these requests; the service's Prometheus metrics count them
(:mod:`service.metrics`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from starlette.routing import Match

from service.api.errors import answer
from service.auth import ProtectedRoute, check_api_key

Handler = Callable[[Request], Awaitable[Response]]


class DirectRoute(ProtectedRoute):
    """An inference route: its endpoint takes the request (and the path parameters, as strings) and returns
    the :class:`Response` itself. Its handler checks the API key (the router's dependencies are not solved)
    and calls the endpoint; :class:`DirectRoutes` calls that handler. (Should a request reach the route
    through FastAPI's router, it gets the same answer: FastAPI calls the same handler.)

    This is FastAPI's documented extension point (a custom ``APIRoute`` overriding ``get_route_handler``).
    """

    def get_route_handler(self) -> Handler:
        endpoint = self.endpoint

        async def handle(request: Request) -> Response:
            await check_api_key(request)
            return await endpoint(request=request, **request.path_params)

        return handle


class DirectRoutes:
    """ASGI, in front of ``app``: a request that fully matches one of ``routers``' :class:`DirectRoute`
    routes (path and method) is answered by it here, its errors answered as the app's exception handlers
    would; anything else (other paths, other methods: the app's 405) goes on to ``app``.

    The direct routes are matched first, before the app's: they must be first among the app's routes too
    (:data:`service.api.routes.PROTECTED` puts them there), so that both would choose the same route.
    """

    def __init__(self, app: FastAPI, routers: Iterable[APIRouter]) -> None:
        self.app = app
        self.routes: list[tuple[DirectRoute, Handler]] = [
            (route, route.get_route_handler())
            for router in routers
            for route in router.routes
            if isinstance(route, DirectRoute)
        ]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            for route, handle in self.routes:
                match, child_scope = route.matches(scope)
                if match is Match.FULL:
                    scope.update(child_scope)
                    scope["app"] = self.app  # what request.app is behind FastAPI: its state, its settings
                    try:
                        response = await handle(Request(scope, receive))
                    except Exception as error:
                        response = answer(scope["path"], error)
                    await response(scope, receive, send)
                    return
        await self.app(scope, receive, send)
