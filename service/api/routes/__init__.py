"""The routers, one module per resource. Protected ones sit behind ``DBF_API_KEY`` when the service has one
(:func:`service.app.create_app` attaches :func:`service.auth.require_api_key`); probes stay open."""

from service.api.routes import admin, inference, models, open_inference, probes

# Predict first: routes are matched in order, and it carries the load.
PROTECTED = (inference.router, open_inference.inference, open_inference.router, models.router, admin.router)
OPEN = (probes.router, probes.open_inference)
