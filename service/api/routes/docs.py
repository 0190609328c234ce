"""The API's documentation: the OpenAPI schema and the pages that show it (Swagger UI, ReDoc). Behind
``DBF_API_KEY`` like the model routes, when the service has one: the schema shows the default model's views
and their dimensions (its predict example). These replace FastAPI's own documentation routes, which take no
dependencies (:func:`service.app.create_app` turns those off)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse

from service.auth import ProtectedRoute

SCHEMA = "/openapi.json"
router = APIRouter(include_in_schema=False, route_class=ProtectedRoute)


@router.get(SCHEMA)
async def schema(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    return get_swagger_ui_html(openapi_url=_schema_url(request), title=f"{request.app.title} - Swagger UI")


@router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    return get_redoc_html(openapi_url=_schema_url(request), title=f"{request.app.title} - ReDoc")


def _schema_url(request: Request) -> str:
    """Where the page's browser finds the schema (under the ASGI root path, as FastAPI's own pages say)."""
    return request.scope.get("root_path", "").rstrip("/") + SCHEMA
