"""Python client for dbf-serve's v1 API (httpx), sync and async, returning typed results. For example::

from service.client import Client

with Client("http://127.0.0.1:8000") as client:
    p = client.predict({"pix": pix_features, "fou": fou_features})  # lists or numpy arrays
    print(p.class_name, p.uncertainty, p.high_conflict, p.blamed_view, p.discount)

It needs httpx, msgspec and numpy only (not the server's dependencies): answers are decoded straight into the
wire types of :mod:`service.schemas`, whose ``Prediction`` has a field for every output of the registry
(:mod:`service.outputs`). Fields a newer service adds are ignored, so an older client keeps working. For
tensors, the Open Inference Protocol's clients (tritonclient, kserve) or :mod:`service.v2` speak ``/v2``.
"""

from __future__ import annotations

import asyncio
import math
import numbers
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

import httpx
import msgspec
import numpy as np

from service.outputs import ViewOpinion
from service.schemas import ErrorBody, Prediction, PredictResponse

# view name -> raw features (lists or numpy arrays); None, or all NaN (a missing view's row in fit's data),
# for a view the sample lacks: left out of what is sent, as the service takes a missing view.
Features = Mapping[str, Sequence[float] | None]
PredictResult = PredictResponse  # model, method, lam, views, predictions

__all__ = ["AsyncClient", "Client", "DBFError", "Prediction", "PredictResult", "ViewOpinion"]

_RESULT = msgspec.json.Decoder(PredictResponse)
_MODELS = msgspec.json.Decoder(dict[str, Any])
_ERROR = msgspec.json.Decoder(ErrorBody)
# An answer's most bytes, by default: the service's largest, DBF_MAX_ANSWER_VALUES numbers at its default
# (2**20), take some 25 MiB of JSON; beyond 256 MiB, a broken server's endless body is cut off.
_MOST_ANSWER_BYTES = 256 << 20
# The most characters of an answer that is not the service's (a proxy's page) an error's message quotes.
_QUOTED = 300
_JSON = {"content-type": "application/json"}
# The longest wait a Retry-After may ask for before a retry: a longer one is the caller's to decide.
_LONGEST_WAIT = 30.0
# Retry-After in seconds (RFC 9110: digits; a fraction taken too). Python's float would read "nan", "-5",
# "inf" and "1_0" as well.
_SECONDS = re.compile(r"[0-9]+(\.[0-9]+)?")


class DBFError(Exception):
    """An error answer of the service.

    Attributes
    ----------
    status : int
        The HTTP status (400 bad input, 401 no or a wrong key, 404 no such model, 413 too large, 503
        overloaded or not ready...).
    type : str
        The error body's reason (``invalid_input``, ``model_not_found``, ``overloaded``...);
        ``http_error`` for an error answer that is not the service's (a proxy's page: the message quotes
        its start), ``invalid_response`` for a success whose body is not the v1 API's answer (a captive
        portal's page, another service's JSON, a body that does not decompress), ``answer_too_large``
        for an answer longer than the client's ``max_answer_bytes``.
    message : str
        What was wrong, naming the sample and view where one is at fault.
    retry_after : float or None
        Seconds the service asked to wait before trying again (a 503's ``Retry-After``), if it did.
    """

    def __init__(self, status: int, type_: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"{status} {type_}: {message}")
        self.status, self.type, self.message, self.retry_after = status, type_, message, retry_after

    def __reduce__(self) -> tuple[type, tuple]:  # picklable (a process pool sends it back to its caller)
        return type(self), (self.status, self.type, self.message, self.retry_after)


def _body(
    samples: Sequence[Features] | Mapping[str, Any],
    method: str | None,
    lam: float | None,
    coverage: float | None,
) -> tuple[bytes, int]:
    """The request's body, and how many samples it holds."""
    body: dict[str, Any] = {"samples": []}
    for index, sample in enumerate(_samples(samples)):
        try:
            body["samples"].append({"views": _views(sample)})
        except ValueError as error:  # which of many samples: named as the service's errors name it
            raise ValueError(f"samples[{index}]: {error}") from None
    if method is not None:
        body["method"] = method
    for key, value in (("lambda", lam), ("coverage", coverage)):
        if value is not None:
            # numpy's scalars too; not a bool (True is no lambda) nor a string
            if (
                isinstance(value, bool | str)
                or not isinstance(value, numbers.Real)
                or not math.isfinite(value)
            ):
                raise ValueError(f"{key} must be a finite number, got {value!r}")
            body[key] = float(value)
    return msgspec.json.encode(body), len(body["samples"])


def _samples(samples: Sequence[Features] | Mapping[str, Any]) -> Sequence[Features]:
    """Samples as a sequence of mappings: given so, or as one ``(N, d)`` matrix per view (fit's layout)."""
    if isinstance(samples, Mapping):
        columns = {name: None if values is None else _array(values) for name, values in samples.items()}
        matrices = {name: values for name, values in columns.items() if values is not None}
        rows = {len(values) for values in matrices.values() if values.ndim == 2}
        if len(rows) != 1 or any(values.ndim != 2 for values in matrices.values()):
            # Which view: among many, the user could not tell (a view of one feature given as its column)
            flat = next((name for name, values in matrices.items() if values.ndim != 2), None)
            if flat is not None:
                wrong = f"view {flat!r}: shape {matrices[flat].shape}, not (N, d)"
                if matrices[flat].ndim == 1:
                    wrong += "; a view of one feature is an (N, 1) matrix: values.reshape(-1, 1)"
            elif rows:
                counts = ", ".join(f"{name!r} {len(values)}" for name, values in matrices.items())
                wrong = f"views of different row counts: {counts}"
            else:
                wrong = "no view given"
            raise ValueError(
                f"{wrong}; samples as a mapping hold one (N, d) matrix per view, N the same for all; or give "
                "a sequence of per-sample mappings {view: features}"
            )
        return [{name: None if v is None else v[i] for name, v in columns.items()} for i in range(rows.pop())]
    samples = list(samples)  # a generator too: checked, then sent (the check alone would use it up)
    if not all(isinstance(sample, Mapping) for sample in samples):
        raise ValueError("samples are a sequence of per-sample mappings {view: features}")
    return samples


def _array(values: Any) -> np.ndarray:
    """``values`` as numpy takes them, but for a generator (numpy makes one object of it: it is listed) and
    a masked array (what is masked was not measured: NaN, as fit marks it)."""
    if isinstance(values, np.ma.MaskedArray):
        return values.astype(np.float64).filled(np.nan)
    array = np.asarray(values)
    if array.ndim == 0 and array.dtype.kind == "O" and isinstance(values, Iterable):
        return np.asarray(list(values))
    return array


def _views(sample: Features) -> dict[str, list]:
    """A sample's views as JSON lists, those it lacks (None, or every value NaN) left out."""
    views = {}
    for name, values in sample.items():
        if values is None:
            continue
        try:
            array = _array(values)
        except ValueError as error:  # ragged lists
            raise ValueError(f"view {name!r}: {error}") from None
        if array.dtype.kind == "b":
            array = array.astype(np.uint8)  # 0 and 1, as fit reads them: JSON's true is no number
        elif array.dtype.kind == "f" and array.dtype.itemsize > 8:
            array = array.astype(np.float64)  # long double: its scalars are no JSON number to msgspec
        elif array.dtype.kind == "c":
            raise ValueError(f"view {name!r}: complex numbers ({array.dtype}); features are real numbers")
        if array.size and array.dtype.kind == "f" and not np.isfinite(array).all():
            if np.isnan(array).all():
                continue
            # JSON has neither NaN nor infinity: sent as null, the service's error would name a null
            odd = array.ravel()[~np.isfinite(array.ravel())][0]
            raise ValueError(
                f"view {name!r}: {odd} among its numbers; a view the sample lacks is None, or all NaN"
            )
        if array.ndim > 1:
            raise ValueError(f"view {name!r}: shape {array.shape}; one sample's features are a flat vector")
        views[name] = array.tolist()
    return views


def _path(model: str | None) -> str:
    if model is None:
        return "/predict"
    if not model:
        raise ValueError("model is empty: give a model's name, or None for the service's default")
    name = quote(model, safe="")
    # "." and ".." would be dot segments, which httpx resolves (model ".." asked for /v1/predict); escaped,
    # they are names
    return f"/v1/models/{name.replace('.', '%2E') if name in ('.', '..') else name}/predict"


def _check_base_url(base_url: str) -> None:
    """Refuse a base URL that is not HTTP's ('127.0.0.1:8000', as tritonclient takes it): httpx would
    refuse each request, and `Client.ready` say False as for a service that is down."""
    scheme = httpx.URL(base_url).scheme
    if scheme not in ("http", "https"):
        # Its scheme only: the URL may hold a user's password.
        raise ValueError(
            f"base_url must start with http:// or https://, as http://127.0.0.1:8000 does (its scheme: "
            f"{scheme!r})"
        )


def _headers(api_key: str | None) -> dict[str, str]:
    """The key's header, the key read as the service reads ``DBF_API_KEY``; a key no service has is refused
    here, never quoted (httpx's error for an illegal header value quotes it, and logs keep errors)."""
    if api_key is None:
        return {}
    key = api_key.strip()  # a key from a file, or a Kubernetes secret, often ends in a line break
    if not key:
        raise ValueError("api_key is empty: give the service's DBF_API_KEY, or None when it has none")
    if not all(" " <= character <= "~" for character in key):
        raise ValueError(
            "api_key holds a character that is not printable ASCII (an accent, a line break): no service's "
            "DBF_API_KEY does"
        )
    return {"Authorization": f"Bearer {key}"}


def _decoded(decoder: msgspec.json.Decoder, response: httpx.Response, content: bytes) -> Any:
    """A success's body ``content`` as ``decoder`` reads it; a `DBFError` for an error answer, or for a
    success that is not an answer of the API."""
    if not response.is_success:
        retry_after = _retry_after(response)
        if response.is_redirect:  # an ingress sending http:// to https://, say
            message = (
                f"redirected to {response.headers['location']}: the client follows no redirect (which would "
                "send the body and the key on); give the address it leads to as base_url"
            )
            raise DBFError(response.status_code, "http_error", message, retry_after)
        try:
            error = _ERROR.decode(content).error
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise DBFError(
                response.status_code, "http_error", _quoted(response, content), retry_after
            ) from None
        raise DBFError(response.status_code, error.type, error.message, retry_after)
    try:
        return decoder.decode(content)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        message = f"not an answer of the v1 API ({error}): {_quoted(response, content)}"
        raise DBFError(response.status_code, "invalid_response", message) from None


def _predicted(response: httpx.Response, content: bytes, samples: int) -> PredictResult:
    """A predict request's answer, one prediction for each of its ``samples`` (`_decoded`)."""
    result = _decoded(_RESULT, response, content)
    if len(result.predictions) != samples:
        message = (
            f"not an answer of the v1 API: {len(result.predictions)} predictions for {samples} "
            f"sample{'' if samples == 1 else 's'}"
        )
        raise DBFError(response.status_code, "invalid_response", message)
    return result


def _cut_off(error: httpx.ReadError | httpx.WriteError, sent: int) -> httpx.TransportError:
    """``error``, of the same type, saying what may have caused it: the service refuses a body over its
    ``DBF_MAX_BODY_BYTES`` (413) and closes the connection without reading the rest, and a client still
    sending may lose that answer (the async one always does: asyncio drops what a socket holds once a write
    to it fails), left with httpx's error, whose message is often empty."""
    cause = str(error) or "the connection was reset"
    message = (
        f"{cause}, on a request of {sent} bytes of body: if that is over the service's DBF_MAX_BODY_BYTES, "
        "it was refused (413) and its connection closed before the answer could be read; send fewer samples "
        "a request"
    )
    return type(error)(message, request=error.request)


def _quoted(response: httpx.Response, content: bytes) -> str:
    """An answer's body, its start only when long (a proxy's page would fill every log line it is in)."""
    text = content.decode(response.encoding or "utf-8", errors="replace")  # a known one: httpx checks
    if not text.strip():
        return f"an empty body ({response.status_code} {response.reason_phrase})"
    return text if len(text) <= _QUOTED else f"{text[:_QUOTED]}... ({len(content)} bytes)"


def _grown(response: httpx.Response, content: bytearray, chunk: bytes, limit: int) -> None:
    """Append ``chunk`` to the answer's ``content`` read so far; a `DBFError` past ``limit`` bytes."""
    if len(content) + len(chunk) > limit:
        message = f"an answer of more than {limit} bytes (max_answer_bytes): not read on"
        raise DBFError(response.status_code, "answer_too_large", message)
    content += chunk


def _timeout(timeout: float | httpx.Timeout | None) -> float | httpx.Timeout | None:
    """``timeout`` checked: 0 would fail every request at once (and make `Client.ready` False, as for a
    service that is down), and httpx refuses the others only at the first request, in its words."""
    if timeout is None or isinstance(timeout, httpx.Timeout):
        return timeout
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not 0 < timeout < math.inf:
        raise ValueError(f"timeout must be a positive number of seconds (or None: no limit), got {timeout!r}")
    return float(timeout)


def _undecodable(response: httpx.Response, error: httpx.DecodingError) -> DBFError:
    encoding = response.headers.get("content-encoding")
    message = f"not an answer of the v1 API: its body is not the {encoding} it says it is ({error})"
    return DBFError(response.status_code, "invalid_response", message)


def _positive(name: str, count: int) -> int:
    if isinstance(count, bool) or not isinstance(count, numbers.Integral) or count < 1:
        raise ValueError(f"{name} must be a whole number of at least 1, got {count!r}")
    return int(count)


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after", "").strip()
    # None when there is none, or an HTTP date, or what is no number of seconds: not ours to give
    return float(value) if _SECONDS.fullmatch(value) else None


def _wait(error: DBFError, attempt: int, retries: int) -> float | None:
    """How long to wait before trying again after ``error`` (a 503 that says when), or None: raise it."""
    if error.status != 503 or error.retry_after is None or attempt >= retries:
        return None
    # A longer wait is raised: retrying sooner than asked would only be shed again.
    return error.retry_after if error.retry_after <= _LONGEST_WAIT else None


def _retries(retries: int) -> int:
    if isinstance(retries, bool) or not isinstance(retries, numbers.Integral) or retries < 0:
        raise ValueError(f"retries must be a whole number of at least 0, got {retries!r}")
    return int(retries)


class Client:
    """A synchronous client of the v1 API.

    A sample is a mapping ``{view: features}``; a view it lacks is left out, or given as None or as all NaN
    (as fit's data marks it). ``method`` and ``lam`` choose the fusion and ``coverage`` the prediction
    sets' (the model's defaults when None); ``model`` the model (the service's default when None).

    Parameters
    ----------
    base_url : str
        The service's address, ``http://`` or ``https://`` (``ValueError`` otherwise), with the path
        prefix it is served under, if any (``https://host/dbf`` behind an ingress at ``/dbf/``).
    api_key : str, optional
        ``DBF_API_KEY``, sent as ``Authorization: Bearer <key>``; surrounding whitespace (a file's line
        break) is stripped, as the service strips it. Empty, or not printable ASCII, it raises
        ``ValueError`` here (the key never quoted).
    retries : int
        How many times a 503 that says when to retry (``Retry-After``: the service's ``overloaded`` and
        ``not_ready``; its ``shutting_down`` says not) is retried after waiting that long; 0: never, the
        ``DBFError`` is raised. One that asks for more than
        30 s is raised at once (its ``retry_after`` says how long: the caller's to decide).
    timeout : float, httpx.Timeout or None
        Seconds for each of connecting, sending and reading (positive; None: no limit), or httpx's
        ``Timeout``.
    max_answer_bytes : int
        The longest answer read (256 MiB; the service's at its default limits are some 25 MiB at most):
        a longer one raises ``DBFError`` ``answer_too_large`` once that much is in, rather than take
        memory without end.
    **httpx_options
        Passed to ``httpx.Client`` (headers, TLS, proxies, transport).

    Raises
    ------
    DBFError
        An error answer of the service, or an answer that is not the service's (``DBFError.type``).
    ValueError
        Features that cannot be sent (NaN or infinity among a view's numbers, a matrix for one sample,
        ragged lists, complex numbers), before anything is sent. Bools are sent as 0 and 1, as fit reads
        them, and a masked array's masked values as NaN; features, and samples, may be generators.
    httpx.TransportError
        A service that cannot be reached (``ConnectError``), answers later than ``timeout``
        (``TimeoutException``) or breaks its answer off (``RemoteProtocolError``).

    Notes
    -----
    A client may be shared by threads (as its ``httpx.Client`` is); an `AsyncClient` belongs to the event
    loop that first used it.
    """

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        *,
        api_key: str | None = None,
        retries: int = 0,
        timeout: float | httpx.Timeout | None = 30.0,
        max_answer_bytes: int = _MOST_ANSWER_BYTES,
        **httpx_options: Any,
    ) -> None:
        headers = {**_headers(api_key), **httpx_options.pop("headers", {})}
        _check_base_url(base_url)
        self.retries = _retries(retries)
        timeout = _timeout(timeout)
        self.max_answer_bytes = _positive("max_answer_bytes", max_answer_bytes)
        self._http = httpx.Client(base_url=base_url, timeout=timeout, headers=headers, **httpx_options)

    def predict(
        self,
        views: Features,
        *,
        model: str | None = None,
        method: str | None = None,
        lam: float | None = None,
        coverage: float | None = None,
    ) -> Prediction:
        """One sample's answer: its label, class name, probabilities, uncertainty, conflict, discounts,
        confidence, prediction set and flag (`service.schemas.Prediction`)."""
        return self.predict_batch(
            [views], model=model, method=method, lam=lam, coverage=coverage
        ).predictions[0]

    def predict_batch(
        self,
        samples: Sequence[Features] | Mapping[str, Any],
        *,
        model: str | None = None,
        method: str | None = None,
        lam: float | None = None,
        coverage: float | None = None,
    ) -> PredictResult:
        """Many samples' answers in one request (at most the service's ``DBF_MAX_SAMPLES``, 1024 by
        default): ``samples`` a sequence of per-sample mappings, or one ``(N, d)`` matrix per view (fit's
        layout; a row all NaN for a sample without that view). The result has the model, the fusion
        used, the views and one `service.schemas.Prediction` per sample, in order."""
        content, count = _body(samples, method, lam, coverage)
        for attempt in range(self.retries + 1):
            try:
                try:
                    answer = self._exchange("POST", _path(model), content=content, headers=_JSON)
                except (httpx.ReadError, httpx.WriteError) as error:
                    raise _cut_off(error, len(content)) from error
                return _predicted(*answer, count)
            except DBFError as error:
                wait = _wait(error, attempt, self.retries)
                if wait is None:
                    raise
                time.sleep(wait)
        raise AssertionError("unreachable")  # the last attempt returns or raises

    def models(self) -> dict[str, Any]:
        """The models served: ``{"default": name or None, "models": [{"name", "views", "classes", ...}]}``."""
        return _decoded(_MODELS, *self._exchange("GET", "/v1/models"))

    def ready(self) -> bool:
        """Whether the service answers and has its models loaded (False if it cannot be reached)."""
        try:
            with self._http.stream("GET", "/ready") as response:  # its status only: the body is not read
                return response.status_code == 200
        except httpx.TransportError:
            return False

    def _exchange(self, method: str, path: str, **options: Any) -> tuple[httpx.Response, bytes]:
        """A request's answer and its body, read up to ``max_answer_bytes``."""
        with self._http.stream(method, path, **options) as response:
            content = bytearray()
            try:
                for chunk in response.iter_bytes():  # decompressed: a gzip bomb is bounded too
                    _grown(response, content, chunk, self.max_answer_bytes)
            except httpx.DecodingError as error:
                raise _undecodable(response, error) from None
        return response, bytes(content)

    def close(self) -> None:
        """Close the client's connections (``with Client(...) as client:`` does it on leaving)."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class AsyncClient:
    """An asynchronous client of the v1 API: `Client`'s parameters and methods, awaited (``aclose``
    for ``close``; ``async with AsyncClient(...) as client:``)."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        *,
        api_key: str | None = None,
        retries: int = 0,
        timeout: float | httpx.Timeout | None = 30.0,
        max_answer_bytes: int = _MOST_ANSWER_BYTES,
        **httpx_options: Any,
    ) -> None:
        headers = {**_headers(api_key), **httpx_options.pop("headers", {})}
        _check_base_url(base_url)
        self.retries = _retries(retries)
        timeout = _timeout(timeout)
        self.max_answer_bytes = _positive("max_answer_bytes", max_answer_bytes)
        self._http = httpx.AsyncClient(base_url=base_url, timeout=timeout, headers=headers, **httpx_options)

    async def predict(
        self,
        views: Features,
        *,
        model: str | None = None,
        method: str | None = None,
        lam: float | None = None,
        coverage: float | None = None,
    ) -> Prediction:
        """One sample's answer (`Client.predict`)."""
        return (
            await self.predict_batch([views], model=model, method=method, lam=lam, coverage=coverage)
        ).predictions[0]

    async def predict_batch(
        self,
        samples: Sequence[Features] | Mapping[str, Any],
        *,
        model: str | None = None,
        method: str | None = None,
        lam: float | None = None,
        coverage: float | None = None,
    ) -> PredictResult:
        """Many samples' answers in one request (`Client.predict_batch`)."""
        content, count = _body(samples, method, lam, coverage)
        for attempt in range(self.retries + 1):
            try:
                try:
                    answer = await self._exchange("POST", _path(model), content=content, headers=_JSON)
                except (httpx.ReadError, httpx.WriteError) as error:
                    raise _cut_off(error, len(content)) from error
                return _predicted(*answer, count)
            except DBFError as error:
                wait = _wait(error, attempt, self.retries)
                if wait is None:
                    raise
                await asyncio.sleep(wait)
        raise AssertionError("unreachable")  # the last attempt returns or raises

    async def models(self) -> dict[str, Any]:
        """The models served (`Client.models`)."""
        return _decoded(_MODELS, *await self._exchange("GET", "/v1/models"))

    async def ready(self) -> bool:
        """Whether the service answers and has its models loaded (False if it cannot be reached)."""
        try:
            async with self._http.stream("GET", "/ready") as response:  # its status only
                return response.status_code == 200
        except httpx.TransportError:
            return False

    async def _exchange(self, method: str, path: str, **options: Any) -> tuple[httpx.Response, bytes]:
        """A request's answer and its body, read up to ``max_answer_bytes`` (`Client._exchange`)."""
        async with self._http.stream(method, path, **options) as response:
            content = bytearray()
            try:
                async for chunk in response.aiter_bytes():
                    _grown(response, content, chunk, self.max_answer_bytes)
            except httpx.DecodingError as error:
                raise _undecodable(response, error) from None
        return response, bytes(content)

    async def aclose(self) -> None:
        """Close the client's connections."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()
