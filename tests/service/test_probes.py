"""Black-box: the service started as users start it answers its probes over HTTP."""

import httpx

from tests.service.conftest import running_service


def test_health_is_live_and_ready_refuses_without_models():
    with running_service() as url:
        assert httpx.get(f"{url}/health").json() == {"status": "ok"}
        ready = httpx.get(f"{url}/ready")
        assert ready.status_code == 503
        assert "no models" in ready.json()["reason"]
