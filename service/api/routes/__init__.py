"""The routers, one module per resource. Protected ones sit behind ``DBF_API_KEY`` when the service has one
(:func:`service.app.create_app` attaches :func:`service.auth.require_api_key`; their routes are
:class:`service.auth.ProtectedRoute`); probes stay open."""

from service.api.routes import admin, docs, inference, models, open_inference, probes

# The inference routes, served ahead of FastAPI's stack (service.api.direct), and first among the app's
# routes too, so that the app would choose the same route for a request.
DIRECT = (inference.router, open_inference.inference)
PROTECTED = (*DIRECT, open_inference.router, models.router, admin.router, docs.router)
OPEN = (probes.router, probes.open_inference)
