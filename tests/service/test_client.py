"""The Python client against the real service, and against loopback servers that answer as broken
deployments do (a proxy's page, a bad Retry-After, an endless body)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import numpy as np
import pytest

from service.client import AsyncClient, Client, DBFError, Prediction
from tests.service.conftest import MODELS, serving

CUB = {"image": np.zeros(1024, np.float32), "text": np.zeros(300)}


@pytest.fixture(scope="module")
def url():
    with serving(MODELS / "cub") as base:
        yield base


def test_sync_client(url):
    with Client(url) as client:
        assert client.ready()
        assert client.models()["default"] == "cub"
        p = client.predict(CUB, method="gbaf")
        assert isinstance(p, Prediction)
        assert p.class_name in client.models()["models"][0]["classes"]
        assert set(p.views) == {"image", "text"} and 0 <= p.uncertainty <= 1
        result = client.predict_batch([CUB, {"text": [0.1] * 300}], model="cub", lam=3.0)
        assert (result.model, result.method, result.lam, len(result.predictions)) == ("cub", "dbf", 3.0, 2)
        assert result.predictions[1].conflict[0] is None and set(result.predictions[1].discount) == {"text"}
        with pytest.raises(DBFError) as error:
            client.predict({"image": [0.0] * 3})
        assert (
            error.value.status == 400
            and "samples[0].views.image: expected 1024 values" in error.value.message
        )
        with pytest.raises(DBFError, match="404 model_not_found"):
            client.predict(CUB, model="nope")


def test_a_view_given_as_none_or_all_nan_is_sent_as_missing(url):
    """As fit's data marks a missing view (a row of NaN), or None: the client leaves the view out, which is
    how the service takes a missing view. Before, None raised a TypeError in the client and NaN a 400."""
    with Client(url) as client:
        text_only = client.predict({"text": CUB["text"]})
        for missing in (None, np.full(1024, np.nan), [float("nan")] * 1024):
            answer = client.predict({"image": missing, "text": CUB["text"]})
            assert set(answer.views) == {"text"} and answer.probability == text_only.probability
        # Not all NaN: JSON has no NaN, and sent as null the service's error named a null never written.
        for odd in (float("nan"), float("inf")):
            with pytest.raises(ValueError, match=f"view 'image': {odd} among its numbers"):
                client.predict({"image": [odd] + [0.0] * 1023, "text": CUB["text"]})


def test_inputs_a_user_has_at_hand_are_sent_as_they_mean(url):
    """numpy's float64 scalars for lam and coverage (a TypeError before); fit's layout, one (N, d) matrix per
    view, for a batch; a model name that is not a path segment (it went into the URL as it was); a matrix
    for one sample, refused saying so (the service said 'expected 1024 values, got 1')."""
    rng = np.random.default_rng(0)
    image, text = rng.random((3, 1024)), rng.random((3, 300))
    image[1] = np.nan  # sample 1 without its image view
    with Client(url) as client:
        rows = [{"image": None if i == 1 else image[i], "text": text[i]} for i in range(3)]
        by_rows = client.predict_batch(rows, lam=np.float64(2.0), coverage=np.float64(0.8))
        by_views = client.predict_batch({"image": image, "text": text}, lam=2.0, coverage=0.8)
        assert by_rows == by_views and by_rows.lam == 2.0 and by_rows.coverage == 0.8
        text_only = client.predict({"text": text[1]}, lam=2.0, coverage=0.8)
        assert by_views.predictions[1] == text_only
        with pytest.raises(DBFError, match=r"404 model_not_found: no model named 'cub\?x=1'"):
            client.predict(CUB, model="cub?x=1")
        with pytest.raises(ValueError, match="lambda must be a finite number"):
            client.predict(CUB, lam=float("nan"))
        with pytest.raises(ValueError, match=r"view 'image': shape \(1, 1024\); one sample's features"):
            client.predict({"image": image[:1], "text": text[0]})


def test_the_key_retries_and_errors_a_user_handles():
    """The API key as an option; a 503 that says when (Retry-After) retried as often as asked, its wait
    readable on the error; the error picklable (a process pool sends it back); a service that cannot be
    reached is not ready."""
    import pickle

    from tests.service.conftest import free_port

    one = {"image": np.zeros(1024, np.float32), "text": np.zeros(300)}
    budget = 40_000
    with serving(MODELS / "cub", api_key="s3cret", body_memory_bytes=budget, retry_after_seconds=0) as base:
        with Client(base) as keyless:
            with pytest.raises(DBFError) as refused:
                keyless.predict(one)
            assert refused.value.status == 401
        overloaded = {"overloaded": 0}
        with (
            Client(
                base, api_key="s3cret", retries=2, event_hooks={"response": [_count(overloaded)]}
            ) as client,
            _upload_held(base, budget - 5_000, "s3cret"),  # the budget's rest is less than a sample's body
        ):
            assert client.models()["default"] == "cub"
            with pytest.raises(DBFError) as shed:
                client.predict(one)
        error = shed.value
        assert (error.status, error.type, error.retry_after, overloaded["overloaded"]) == (
            503,
            "overloaded",
            0.0,
            3,
        )
        again = pickle.loads(pickle.dumps(error))
        assert (again.status, again.type, again.message, again.retry_after) == (
            503,
            "overloaded",
            error.message,
            0.0,
        )
    with Client(f"http://127.0.0.1:{free_port()}", timeout=2) as nobody:
        assert nobody.ready() is False


@contextlib.contextmanager
def _upload_held(base: str, declared: int, key: str) -> Iterator[None]:
    """A predict request that declares ``declared`` bytes of body and sends all but the last, held open:
    the service holds them in its body budget (until the body times out). Yields once a one-sample request
    is shed for it."""
    host, port = base.removeprefix("http://").split(":")
    head = (
        f"POST /v1/models/cub/predict HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {declared}\r\n\r\n{{"
    )
    probe = {"samples": [{"views": {"image": [0.0] * 1024, "text": [0.0] * 300}}]}
    with socket.create_connection((host, int(port)), timeout=30) as held:
        held.sendall(head.encode() + b" " * (declared - 2))
        for _ in range(200):  # the hold is in once the service has read its head (another connection)
            answer = httpx.post(
                f"{base}/v1/models/cub/predict", json=probe, headers={"Authorization": f"Bearer {key}"}
            )
            if answer.status_code == 503:
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"a one-sample request was never shed beside the held upload: {answer.text}")
        yield


def _count(counts: dict[str, int]):
    def hook(response) -> None:
        if response.status_code == 503:
            counts["overloaded"] += 1

    return hook


def test_async_client(url):
    async def scenario():
        async with AsyncClient(url) as client:
            assert await client.ready()
            results = await asyncio.gather(*(client.predict(CUB) for _ in range(8)))
            assert len({p.label for p in results}) == 1  # same input, same answer, concurrently

    asyncio.run(scenario())


def test_the_client_and_the_v2_codec_need_numpy_httpx_and_msgspec_only():
    """A client's environment has no server: importing the client and the v2 codec (and using the latter)
    must not need onnxruntime, prometheus-client, the web framework, pydantic or the fusion package."""
    server_side = (
        "onnxruntime", "prometheus_client", "fastapi", "starlette", "uvicorn", "anyio", "pydantic",
        "pydantic_settings", "orjson", "simdjson", "array_api_compat", "torch", "fusion", "manifest",
    )  # fmt: skip
    script = f"""
import sys
import threading

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {server_side!r}:
            raise ImportError(f"a client must not need {{name}}")

sys.meta_path.insert(0, Refuse())
import numpy as np
from service.client import AsyncClient, Client, Prediction
from service.v2 import decode_response, encode_request
body, headers = encode_request({{"mor": np.zeros((2, 6), np.float32)}})
answer = b'{{"outputs": [{{"name": "label", "datatype": "INT64", "shape": [2], "data": [1, 2]}}]}}'
assert decode_response(answer, {{}})["label"].tolist() == [1, 2]
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_samples_and_features_given_as_iterables_or_bools_are_sent_as_they_mean(url):
    """A generator of samples was used up by the client's check of them, and the service was sent none (a
    400: 'samples' is empty); features as a generator, or complex, raised msgspec's TypeError, which names
    no view, and ragged ones numpy's ValueError, which names none either; bools (fit reads them as 0 and 1)
    were sent as JSON true and false, which the service refuses."""
    with Client(url) as client:
        expected = client.predict_batch([CUB, CUB])
        assert client.predict_batch(dict(CUB) for _ in range(2)) == expected
        text = CUB["text"].tolist()
        assert client.predict({"image": CUB["image"], "text": iter(text)}) == expected.predictions[0]
        assert client.predict({"image": CUB["image"], "text": np.zeros(300, bool)}) == expected.predictions[0]
        with pytest.raises(ValueError, match="view 'text': complex"):
            client.predict({"text": np.zeros(300, complex)})
        with pytest.raises(ValueError, match="view 'text': "):
            client.predict({"text": [[0.0], [0.0, 1.0]]})


# --- against servers that answer as a broken deployment does --------------------------------------------

_OVERLOADED = b'{"error": {"type": "overloaded", "message": "busy"}}'


def _answer(status: str, body: bytes, *headers: str) -> bytes:
    """An HTTP/1.1 answer, as bytes on the wire, that closes its connection."""
    head = "".join(f"{header}\r\n" for header in headers)
    return (
        f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n{head}\r\n".encode() + body
    )


@contextlib.contextmanager
def _loopback_server(handle: Callable[[socket.socket, threading.Event], None]) -> Iterator[str]:
    """A loopback server that gives each connection it accepts to ``handle`` (with an event set once the
    block ends), one at a time, in a thread; yields its base URL."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)  # to see the block end
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                handle(conn, done)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        done.set()
        thread.join(timeout=5)
        listener.close()


def _server(answer: bytes, seen: list[bytes] | None = None) -> contextlib.AbstractContextManager[str]:
    """A loopback HTTP server that reads each request (head and Content-Length body), appends it to ``seen``
    and sends ``answer`` as it is; yields its base URL."""

    def handle(conn: socket.socket, done: threading.Event) -> None:
        request = b""
        while b"\r\n\r\n" not in request and (chunk := conn.recv(65536)):
            request += chunk
        head, _, body = request.partition(b"\r\n\r\n")
        length = next(
            (int(f.split(b":")[1]) for f in head.lower().split(b"\r\n") if f.startswith(b"content-length:")),
            0,
        )
        while len(body) < length and (chunk := conn.recv(65536)):
            body += chunk
        if seen is not None:
            seen.append(head + b"\r\n\r\n" + body)
        conn.sendall(answer)

    return _loopback_server(handle)


def _predict_with(kind: type, base: str, **options: object) -> Prediction:
    """One sample predicted by a fresh ``Client`` or ``AsyncClient`` on ``base``."""
    if kind is Client:
        with Client(base, **options) as client:
            return client.predict({"a": [1.0]})

    async def scenario() -> Prediction:
        async with AsyncClient(base, **options) as client:
            return await client.predict({"a": [1.0]})

    return asyncio.run(scenario())


@pytest.mark.parametrize("kind", [Client, AsyncClient])
@pytest.mark.parametrize(
    ("value", "retry_after"), [("nan", None), ("-5", None), ("1_0", None), ("inf", None), ("31", 31.0)]
)
def test_a_retry_after_that_is_no_short_wait_is_raised_at_once(kind, value, retry_after):
    """Retry-After is an HTTP date or whole seconds (RFC 9110). Read as Python's float, 'nan' and '-5' made
    the sync client's sleep raise ValueError and the async one retry at once, and '1_0' was 10 s; a wait
    longer than the longest the client waits (30 s; inf too) was cut to 30 s and retried, sooner than the
    service asked. Such a 503 is now raised at once: a longer wait is the caller's to decide."""
    seen: list[bytes] = []
    answer = _answer("503 Service Unavailable", _OVERLOADED, f"Retry-After: {value}")
    with _server(answer, seen) as base:
        started = time.monotonic()
        with pytest.raises(DBFError) as error:
            _predict_with(kind, base, retries=3)
    assert (error.value.status, error.value.type, error.value.retry_after) == (503, "overloaded", retry_after)
    assert len(seen) == 1 and time.monotonic() - started < 5


@pytest.mark.parametrize("kind", [Client, AsyncClient])
@pytest.mark.parametrize("retries", [-1, 1.5, True])
def test_retries_that_are_no_count_are_refused_when_the_client_is_made(kind, retries):
    """retries=-1 made predict raise AssertionError('unreachable') without sending anything; 1.5 a
    TypeError at the first request."""
    with pytest.raises(ValueError, match="retries must be a whole number"):
        kind("http://127.0.0.1:1", retries=retries)


_NOT_V1 = {
    "a proxy's page with 200": ("200 OK", b"<html><body>Sign in to the network</body></html>"),
    "an empty 200": ("200 OK", b""),
    "a 204": ("204 No Content", b""),
    "another service's JSON": ("200 OK", b'{"model": "m"}'),
    "a JSON array": ("200 OK", b"[]"),
}


@pytest.mark.parametrize("kind", [Client, AsyncClient])
@pytest.mark.parametrize("case", _NOT_V1)
def test_an_answer_that_is_not_the_v1_apis_raises_dbf_error(kind, case):
    """A success status whose body is not a v1 answer (a captive portal's page, a wrong base URL's service)
    raised msgspec's DecodeError or ValidationError, which the client's documentation never names."""
    status, body = _NOT_V1[case]
    with _server(_answer(status, body)) as base, pytest.raises(DBFError) as error:
        _predict_with(kind, base)
    assert (error.value.status, error.value.type) == (int(status[:3]), "invalid_response")
    assert "not an answer of the v1 API" in error.value.message


@pytest.mark.parametrize("body", [b"<html>Sign in</html>", b""])
def test_models_that_are_not_json_raise_dbf_error(body):
    with _server(_answer("200 OK", body)) as base, Client(base) as client, pytest.raises(DBFError) as error:
        client.models()
    assert (error.value.status, error.value.type) == (200, "invalid_response")


@pytest.mark.parametrize(
    ("charset", "page", "quoted"),
    [
        ("latin-1", "caf\u00e9".encode("latin-1"), "caf\u00e9"),
        ("bogus", b"<html>oops</html>", "<html>oops</html>"),
    ],
)
def test_a_proxys_page_is_quoted_in_its_charset_or_utf8(charset, page, quoted):
    """A page whose charset no codec has (a proxy's typo) raised LookupError while its error was made."""
    answer = _answer("502 Bad Gateway", page, f"Content-Type: text/html; charset={charset}")
    with _server(answer) as base, Client(base) as client, pytest.raises(DBFError) as error:
        client.predict({"a": [1.0]})
    assert (error.value.type, error.value.message) == ("http_error", quoted)


def test_a_proxys_long_error_page_is_quoted_in_short():
    """A proxy's 502 page was the error's whole message: a megabyte of HTML in every log line."""
    page = b"<html>" + b"x" * 1_000_000 + b"</html>"
    answer = _answer("502 Bad Gateway", page, "Content-Type: text/html")
    with _server(answer) as base, Client(base) as client, pytest.raises(DBFError) as error:
        client.predict({"a": [1.0]})
    assert (error.value.status, error.value.type) == (502, "http_error")
    assert error.value.message.startswith("<html>xxx") and "1000013 bytes" in error.value.message
    assert len(str(error.value)) < 1000


@pytest.mark.parametrize("kind", [Client, AsyncClient])
def test_a_key_is_read_as_the_service_reads_it_and_never_repeated(kind):
    """A key read from a file ends in a line break, which the service strips from DBF_API_KEY: the client
    sent it as it was, and httpx refused the header with the key in its message (LocalProtocolError:
    Illegal header value b'Bearer s3cret\\n'): a secret in the log. An empty key went as 'Bearer ', and
    one not ASCII raised UnicodeEncodeError, each at the first request rather than where it was given."""
    seen: list[bytes] = []
    answer = _answer("200 OK", b'{"default": null, "models": []}')
    with _server(answer, seen) as base, Client(base, api_key=" s3cret\n") as client:
        client.models()
    assert b"\r\nauthorization: Bearer s3cret\r\n" in seen[0].replace(b"Authorization", b"authorization")
    for key in ("", " \n", "s3\ncret", "s3cr\u00e9t"):
        with pytest.raises(ValueError, match="api_key") as error:
            kind("http://127.0.0.1:1", api_key=key)
        assert "s3" not in str(error.value) and "cret" not in str(error.value)


@pytest.mark.parametrize("kind", [Client, AsyncClient])
@pytest.mark.parametrize("base", ["127.0.0.1:8000", "localhost:8000", "ftp://127.0.0.1"])
def test_a_base_url_that_is_not_http_is_refused_when_the_client_is_made(kind, base):
    """'127.0.0.1:8000' (as tritonclient takes it) raised httpx's UnsupportedProtocol at each request,
    and ready() said False, as for a service that is down: a wrong setting looked like an outage."""
    with pytest.raises(ValueError, match=r"base_url must start with http:// or https://"):
        kind(base)


def test_a_model_named_with_dots_is_asked_for_by_name(url):
    """'.' and '..' went into the path as they were, and httpx resolved them as dot segments: model='..'
    asked for /v1/predict (404 'no endpoint /v1/predict'). An empty name asked for /v1/models//predict."""
    with Client(url) as client:
        for name in (".", ".."):
            with pytest.raises(DBFError, match=f"404 model_not_found: no model named '{name}'"):
                client.predict(CUB, model=name)
        with pytest.raises(ValueError, match="model is empty"):
            client.predict(CUB, model="")


@contextlib.contextmanager
def _endless_answer(status: str) -> Iterator[tuple[str, list[int]]]:
    """A loopback server that answers each request with ``status`` and a chunked body that never ends (a
    megabyte at a time, until the client hangs up); yields its base URL and the bytes it got to send."""
    sent: list[int] = []

    def handle(conn: socket.socket, done: threading.Event) -> None:
        with contextlib.suppress(OSError):
            conn.recv(65536)
            conn.sendall(f"HTTP/1.1 {status}\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
            chunk = b"%x\r\n%s\r\n" % (1 << 20, b" " * (1 << 20))
            while not done.is_set():
                conn.sendall(chunk)
                sent.append(len(chunk))

    with _loopback_server(handle) as base:
        yield base, sent


@pytest.mark.parametrize("kind", [Client, AsyncClient])
@pytest.mark.parametrize("status", ["200 OK", "502 Bad Gateway"])
def test_an_answer_past_max_answer_bytes_is_not_read_on(kind, status):
    """An answer was read whole, however long: a broken server's endless body took memory until the
    process died, and never timed out (bytes kept coming)."""
    with _endless_answer(status) as (base, sent), pytest.raises(DBFError) as error:
        _predict_with(kind, base, max_answer_bytes=4 << 20)
    assert (error.value.status, error.value.type) == (int(status[:3]), "answer_too_large")
    assert "more than 4194304 bytes" in error.value.message
    assert sum(sent) < 64 << 20  # the socket buffers' worth past the limit, not all it would send


def test_max_answer_bytes_is_a_count_of_bytes():
    with pytest.raises(ValueError, match="max_answer_bytes must be a whole number"):
        Client(max_answer_bytes=0)


@pytest.mark.parametrize("kind", [Client, AsyncClient])
def test_an_answer_with_another_count_of_predictions_raises_dbf_error(kind):
    """A v1 answer with no prediction for the sample sent made predict raise IndexError, and predict_batch
    returned fewer predictions than samples, which a caller zipping them with its samples would not see."""
    answer = b'{"model": "m", "method": "dbf", "lambda": 1.0, "views": ["a"], "predictions": []}'
    with _server(_answer("200 OK", answer)) as base, pytest.raises(DBFError) as error:
        _predict_with(kind, base)
    assert (error.value.status, error.value.type) == (200, "invalid_response")
    assert "0 predictions for 1 sample" in error.value.message


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (
            _answer("308 Permanent Redirect", b"", "Location: https://example.org/dbf/predict"),
            "redirected to https://example.org/dbf/predict: the client follows no redirect",
        ),
        (_answer("502 Bad Gateway", b""), "an empty body (502 Bad Gateway)"),
    ],
    ids=["redirect", "empty 502"],
)
def test_an_error_answer_without_a_body_says_what_it_was(answer, message):
    """An ingress's redirect (http:// to https://) and a proxy's empty 502 raised a DBFError whose message
    was empty ('308 http_error: '), saying neither where to go nor what answered."""
    with _server(answer) as base, Client(base) as client, pytest.raises(DBFError) as error:
        client.predict({"a": [1.0]})
    assert error.value.type == "http_error" and error.value.message.startswith(message)


def test_masked_and_long_double_features_are_sent_as_they_mean(url):
    """A masked array was sent with the values under its mask, as if they had been measured; numpy's long
    double raised msgspec's TypeError. Masked values are NaN now: all masked, the view is missing."""
    with Client(url) as client:
        text_only = client.predict({"text": CUB["text"]})
        hidden = np.ma.masked_all(1024)
        assert client.predict({"image": hidden, "text": CUB["text"]}) == text_only
        partly = np.ma.masked_array(np.zeros(1024), mask=[True] + [False] * 1023)
        with pytest.raises(ValueError, match="view 'image': nan among its numbers"):
            client.predict({"image": partly, "text": CUB["text"]})
        both = client.predict(CUB)
        assert client.predict({"image": CUB["image"], "text": CUB["text"].astype(np.longdouble)}) == both


def test_features_that_cannot_be_sent_are_refused_naming_their_sample():
    """In a batch, the ValueError for a sample's NaN named its view only: which of a thousand samples, the
    caller had to find (the service's errors name it: samples[i].views.<name>)."""
    image = np.zeros((3, 1024))
    image[2, 5] = np.nan
    with Client("http://127.0.0.1:1") as client:  # refused before anything is sent
        with pytest.raises(ValueError, match=r"^samples\[2\]: view 'image': nan among its numbers"):
            client.predict_batch({"image": image, "text": np.zeros((3, 300))})
        with pytest.raises(ValueError, match=r"^samples\[1\]: view 'text': complex"):
            client.predict_batch([CUB, {"text": np.zeros(300, complex)}])


def test_fits_layout_takes_masked_matrices_and_refuses_a_number():
    """Fit's layout, one (N, d) matrix per view, dropped a masked matrix's mask (its masked values sent as
    measured), and a number for a view's matrix raised TypeError('len() of unsized object')."""
    image = np.ma.masked_array(np.zeros((2, 1024)), mask=[[False] * 1024, [False] + [True] * 1023])
    with Client("http://127.0.0.1:1") as client:  # refused before anything is sent
        with pytest.raises(ValueError, match=r"^samples\[1\]: view 'image': nan among"):
            client.predict_batch({"image": image, "text": np.zeros((2, 300))})
        with pytest.raises(ValueError, match="one \\(N, d\\) matrix per view"):
            client.predict_batch({"image": 1.0})


def test_fits_layout_names_the_view_whose_matrix_is_wrong():
    """A view of one feature (a plain numeric Parquet column, which fit reads as width 1) given as the
    column it is, shape (N,), or views of different row counts, were refused without naming which view:
    with many views, the user had to find it."""
    with Client("http://127.0.0.1:1") as client:  # refused before anything is sent
        with pytest.raises(
            ValueError, match=r"view 'alcohol': shape \(4,\), not \(N, d\); a view of one feature"
        ):
            client.predict_batch({"acids": np.zeros((4, 7)), "alcohol": np.zeros(4)})
        with pytest.raises(ValueError, match=r"views of different row counts: 'acids' 5, 'alcohol' 4"):
            client.predict_batch({"acids": np.zeros((5, 7)), "alcohol": np.zeros((4, 1))})


def test_a_client_shared_by_threads_answers_each_its_own(url):
    """As documented: one Client, many threads, each answer the one its own sample has alone."""
    rng = np.random.default_rng(1)
    samples = [{"image": rng.random(1024), "text": rng.random(300)} for _ in range(16)]
    with Client(url) as client:
        alone = [client.predict(sample) for sample in samples]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            shared = list(pool.map(client.predict, samples * 4))
    assert shared == alone * 4


@pytest.mark.parametrize("prefix", ["/dbf", "/dbf/"])
def test_a_base_url_with_a_path_prefix_keeps_it(prefix):
    """As documented, for a service behind an ingress at /dbf/: every request under the prefix, the model's
    name one path segment."""
    seen: list[bytes] = []
    answer = b'{"model": "a b/c", "method": "dbf", "lambda": 1.0, "views": ["a"], "predictions": []}'
    with _server(_answer("200 OK", answer), seen) as base, Client(base + prefix) as client:
        with pytest.raises(DBFError):  # no prediction: the request line is what is checked
            client.predict({"a": [1.0]}, model="a b/c")
        client.ready()
    assert [request.split(b"\r\n")[0] for request in seen] == [
        b"POST /dbf/v1/models/a%20b%2Fc/predict HTTP/1.1",
        b"GET /dbf/ready HTTP/1.1",
    ]


def test_a_body_over_the_services_limit_gets_a_clear_error_from_either_client():
    """The service refuses a body over DBF_MAX_BODY_BYTES (413) and closes the connection without reading
    the rest; the sync client read the 413, the async one (asyncio drops what a socket holds once a write to
    it fails) raised httpx.ReadError with an empty message, which says nothing of why."""
    rng = np.random.default_rng(0)
    wide = {"pix": rng.random((1000, 240))}  # some 4.6 MB of JSON

    async def scenario(base: str) -> None:
        async with AsyncClient(base) as client:
            await client.predict_batch(wide)

    with serving(MODELS / "handwritten", max_body_bytes=200_000) as base:
        with Client(base) as client, pytest.raises(DBFError, match="413 payload_too_large"):
            client.predict_batch(wide)
        with pytest.raises((DBFError, httpx.TransportError)) as error:
            asyncio.run(scenario(base))
    if isinstance(error.value, DBFError):  # the answer read: better still
        assert error.value.status == 413
    else:
        assert re.search(
            r"on a request of \d+ bytes of body: if that is over the service's DBF_MAX_BODY_BYTES",
            str(error.value),
        )


@pytest.mark.parametrize("kind", [Client, AsyncClient])
@pytest.mark.parametrize("timeout", [0, -1, float("nan"), "5"])
def test_a_timeout_that_is_no_wait_is_refused_when_the_client_is_made(kind, timeout):
    """timeout=0 made every request fail at once (ConnectError: '[Errno 115] Operation now in progress')
    and ready() say False, as for a service that is down; -1 and NaN raised ValueError, '5' TypeError, in
    httpx's words at the first request."""
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
        kind("http://127.0.0.1:1", timeout=timeout)


@pytest.mark.parametrize("kind", [Client, AsyncClient])
def test_a_body_that_does_not_decompress_raises_dbf_error(kind):
    """An answer saying gzip whose body is not raised httpx.DecodingError, which is no TransportError and
    which the client's documentation never names."""
    answer = _answer("200 OK", b"not gzip at all", "Content-Encoding: gzip")
    with _server(answer) as base, pytest.raises(DBFError) as error:
        _predict_with(kind, base)
    assert (error.value.status, error.value.type) == (200, "invalid_response")
    assert "gzip" in error.value.message


@pytest.mark.parametrize("option", ["lam", "coverage"])
@pytest.mark.parametrize("value", ["abc", [0.5], True])
def test_a_fusion_option_that_is_no_number_is_refused_naming_it(option, value):
    """lam='abc' raised float's ValueError and lam=[0.5] its TypeError, neither naming the option; True was
    sent as 1.0."""
    name = {"lam": "lambda", "coverage": "coverage"}[option]
    with Client("http://127.0.0.1:1") as client, pytest.raises(ValueError, match=f"{name} must be a finite"):
        client.predict(CUB, **{option: value})
