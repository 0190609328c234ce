"""The image's HEALTHCHECK: ``python -m service.healthcheck /ready`` asks the service in this container for
the path, at the address it listens on (``DBF_HOST``; its loopback for a wildcard) and ``DBF_PORT``, and
exits 0 on a 2xx answer, else 1 with the reason. Python, as there is no curl in slim images; the standard
library only, so that it starts fast.

>>> ready_url({"DBF_HOST": "::", "DBF_PORT": "9000"})
'http://[::1]:9000/ready'
>>> ready_url({"DBF_PORT": " 9000.0 "})
'http://127.0.0.1:9000/ready'
"""

from __future__ import annotations

import os
import sys
import urllib.request
from collections.abc import Mapping

# A wildcard listens on every address of its family: ask that family's loopback. (``::`` is IPv6 alone:
# asyncio binds it IPV6_V6ONLY, so 127.0.0.1 finds nothing there.)
LOOPBACK = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}


def ready_url(environ: Mapping[str, str], path: str = "/ready") -> str:
    host = environ.get("DBF_HOST", "127.0.0.1").strip().strip("[]")
    host = LOOPBACK.get(host, host)
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{_port(environ.get('DBF_PORT', '8000'))}{path}"


def _port(text: str) -> int | str:
    """``DBF_PORT`` as the service's settings read it (spaces around, ``8000.0``); the text as it is where it
    is not a number (the request fails, saying so)."""
    try:
        return int(text)
    except ValueError:
        try:
            number = float(text)
        except ValueError:
            return text
        return int(number) if number.is_integer() else text


def main(argv: list[str]) -> None:
    url = ready_url(os.environ, *argv[1:2])
    try:
        urllib.request.urlopen(url, timeout=4)
    except OSError as error:  # no answer, or an HTTP error status (503 while the models load)
        sys.exit(f"{url}: {error}")


if __name__ == "__main__":
    main(sys.argv)
