"""The core that knows no protocol (as KServe's DataPlane): which models are served, the request pipeline
(:meth:`DataPlane.serve`: find the model, let the codec refuse what it cannot take, receive the body, admit,
decode, micro-batch, predict, encode), admission (load shedding, the body memory budget), the inference
threads, reloads and the request metrics, once for every protocol. A front end (the REST routes, the gRPC
servicer) is a :class:`Codec` and an entry point that hands its requests to :meth:`DataPlane.serve`.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager, contextmanager
from functools import partial
from typing import Any, Protocol, TypeVar

import anyio

from calibration import CoverageError, conformal_rank
from service import metrics, runtime
from service.batching import BatchWait, MicroBatcher
from service.errors import InvalidInput, ModelNotFound, NotReady, Overloaded, PayloadTooLarge
from service.inference import InferenceRequest, ModelSignature, Result
from service.reload import ModelLoads
from service.repository import LoadedModel, Repository
from service.settings import Settings

T = TypeVar("T")

# Requests with at most this many sample-views are micro-batched with others; a bigger one is a batch
# already, and runs alone (no queue).
BATCHED_SAMPLE_VIEWS = 256
# Work runs on the event loop when it is short (a millisecond or two at most), else on a thread, so that no
# request stalls the others or /health for long. A hop to a thread and back costs far more than it saves
# for short work: the GIL's hand-offs between the threads and the event loop (docs/benchmarks.md).
#
# A batch of at most this many feature values (samples x the views' dimensions) runs its heads and fusion on
# the event loop when they run on the CPU (most of it small numpy calls that hold the GIL). Bigger batches,
# and heads on a GPU (whose runs release the GIL while the device works), go to the inference threads.
INLINE_PREDICT_FEATURES = 256 * 1024
# A codec's decoding and encoding (Codec.body_bytes, Codec.binary_answer): text (JSON) costs in
# proportion to its bytes and numbers, binary tensors (copied and checked whole) far less per byte.
INLINE_BODY_BYTES = 16 * 1024  # of text
INLINE_ANSWER_VALUES = 4096  # numbers answered as text
INLINE_TENSOR_BYTES = 4 << 20  # of binary tensors
INLINE_TENSOR_VALUES = 256 * 1024  # numbers answered as binary tensors


class Codec(Protocol):
    """A protocol's wire format over the core (:mod:`service.v1`, :mod:`service.v2`,
    :mod:`service.grpc_codec`): modules with these functions, and the name its requests are counted under."""

    PROTOCOL: str  # the ``protocol`` label of the request metrics

    def accept(self, headers: Mapping[str, str]) -> None:
        """Refuse, before the body is received, what this protocol does not take."""

    def decode(
        self, body: Any, headers: Mapping[str, str], signature: ModelSignature, *, max_samples: int
    ) -> tuple[InferenceRequest, Any]:
        """The request in a received body (whose ``len`` is its size in bytes), and the context to answer
        it with."""

    def encode(self, context: Any, result: Result) -> Any:
        """The answer to a decoded request: what the front end sends."""

    def locate(self, error: InvalidInput, context: Any) -> InvalidInput:
        """A core error about one sample's view, worded in the protocol's grammar."""

    def body_bytes(self, body: Any, headers: Mapping[str, str]) -> tuple[int, int]:
        """The body's bytes of text (JSON: decoding costs in proportion) and of binary tensors (far less)."""

    def binary_answer(self, context: Any) -> bool:
        """Whether every number of the answer goes out in binary tensors (else some as text)."""


class BodyBudget:
    """Bytes of request bodies buffered at once, across requests: a reservation past the budget is shed
    (503 overloaded), so that concurrent big uploads cannot exhaust the process's memory."""

    def __init__(self, limit: int, retry_after: int) -> None:
        self.limit, self.used, self._retry_after = limit, 0, retry_after

    def reserve(self, size: int, *, body: int) -> None:
        """Hold ``size`` more bytes of a body of ``body`` bytes so far: shed (503) past the budget, or
        refused (413) where the body alone is more than the budget holds, which no retry can change."""
        if body > self.limit:
            raise PayloadTooLarge(
                f"a body of {body} bytes (decompressed) is more than the {self.limit} that this service "
                "holds at once for all requests together (DBF_BODY_MEMORY_BYTES): send fewer samples a "
                "request, or raise that setting"
            )
        if self.used + size > self.limit:
            raise Overloaded(
                f"{self.used} bytes of request bodies buffered, the most this service holds at once "
                "(DBF_BODY_MEMORY_BYTES); retry later",
                headers={"Retry-After": str(self._retry_after)},
            )
        self.used += size  # one event loop: no lock needed

    def release(self, size: int) -> None:
        self.used -= size


class DataPlane:
    """Models, admission, batching and threads: what every protocol's request goes through."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.repository: Repository | None = None
        self.load_error = "models are loading"
        # Reloads (service.reload): one at a time, each load in a thread of its own.
        self.reload_lock = anyio.Lock()
        self.loads = ModelLoads()
        self.in_flight = 0
        self.bodies = BodyBudget(settings.body_memory_bytes, settings.retry_after_seconds)
        self._limiter = anyio.CapacityLimiter(settings.inference_threads)
        # Decoding and encoding are Python and msgspec work, bound by the GIL: a second thread would not
        # make it faster, only make the event loop wait longer for the GIL. The heads and fusion (onnxruntime,
        # numpy) release it, and run on the inference threads meanwhile.
        self._codec_limiter = anyio.CapacityLimiter(1)
        self._batcher = (
            MicroBatcher(
                self.predict,
                self._limiter,
                max_samples=settings.batch_max_samples,
                max_delay=settings.batch_max_delay_ms / 1000,
            )
            if settings.batching
            else None
        )

    def ready(self) -> Repository:
        """The models being served, or :class:`NotReady` with the reason."""
        if self.repository is None:
            # Only while the models load at start (a failed start exits; a failed reload keeps the models
            # served): a retry soon succeeds, and clients that retry on a Retry-After (ours) do so.
            raise NotReady(
                f"models are not loaded: {self.load_error}",
                headers={"Retry-After": str(self.settings.retry_after_seconds)},
            )
        return self.repository

    def model(self, name: str | None, version: str | None = None) -> LoadedModel:
        """The model called ``name`` (the default one for None), at ``version`` if one is asked for."""
        repository = self.ready()
        model = repository.get(name)
        if model is None and name is None:
            raise ModelNotFound(
                f"no default model: DBF_DEFAULT_MODEL names none of {sorted(repository.models)}; name the "
                "model (/v1/models/{name}/predict, /v2/models/{name}/infer)"
            )
        if model is None:
            raise ModelNotFound(f"no model named {name!r}; available: {sorted(repository.models)}")
        if version is not None and version != model.signature.version:
            served = model.signature.version
            raise ModelNotFound(
                f"model {model.name!r} has no version {version!r}; it serves version {served!r}"
            )
        return model

    async def serve(
        self,
        codec: Codec,
        name: str | None,
        version: str | None,
        headers: Mapping[str, str],
        received: AbstractAsyncContextManager[Any],
        *,
        batch_wait: BatchWait | None = None,
    ) -> Any:
        """One inference request in ``codec``'s protocol for the model ``name`` (the default for None) at
        ``version`` (any for None): its answer, as ``codec.encode`` makes it. ``received`` gives the body
        (and holds its bytes in :attr:`bodies` until the answer is made); the front end receives it.
        ``batch_wait``: how long its micro-batch waits for others (:mod:`service.batching`)."""
        model = self.model(name, version)
        codec.accept(headers)
        # The slot is taken once the body is in: a slow upload holds its connection, never a predict slot.
        async with received as body:
            with self.admitted(model, codec.PROTOCOL):
                decoded, context = await self.run(
                    codec.decode,
                    body,
                    headers,
                    model.signature,
                    max_samples=self.settings.max_samples,
                    inline=_decodes_inline(*codec.body_bytes(body, headers)),
                )
                try:
                    result = await self.infer(model, decoded, batch_wait)
                except InvalidInput as error:
                    if error.sample is None:
                        raise
                    raise codec.locate(error, context) from None
                limit = INLINE_TENSOR_VALUES if codec.binary_answer(context) else INLINE_ANSWER_VALUES
                small = len(result) * model.values_per_sample <= limit
                return await self.run(codec.encode, context, result, inline=small)

    @contextmanager
    def admitted(self, model: LoadedModel, protocol: str = "rest") -> Iterator[None]:
        """Count the request in flight, or shed it at once with 503 + Retry-After when too many are; its
        time inside is the request latency of the model, counted under ``protocol``."""
        settings = self.settings
        if self.in_flight >= settings.max_in_flight:
            raise Overloaded(
                f"{self.in_flight} requests in flight, the most this service takes (DBF_MAX_IN_FLIGHT); "
                "retry later",
                headers={"Retry-After": str(settings.retry_after_seconds)},
            )
        self.in_flight += 1  # one event loop: no lock needed
        started = time.perf_counter()
        try:
            yield
        finally:
            self.in_flight -= 1
            metrics.REQUEST_SECONDS.labels(model.name, protocol).observe(time.perf_counter() - started)

    async def infer(
        self, model: LoadedModel, request: InferenceRequest, batch_wait: BatchWait | None = None
    ) -> Result:
        """Heads, fusion, flag and calibration for ``request``: micro-batched with others when small (its
        batch waiting for more as ``batch_wait`` says), else alone, off the event loop either way."""
        _check_answer(model, len(request), self.settings.max_answer_values)
        if request.coverage is not None:
            _check_coverage(model, request.coverage)
        metrics.BATCH_SIZE.labels(model.name).observe(len(request))
        if self._batcher is not None and len(request) * request.present.shape[1] <= BATCHED_SAMPLE_VIEWS:
            return await self._batcher.submit(model, request, batch_wait)
        return await self.predict(model, request, limiter=self._limiter)

    async def predict(
        self, model: LoadedModel, request: InferenceRequest, *, limiter: anyio.CapacityLimiter | None = None
    ) -> Result:
        """:func:`service.runtime.predict`, here if small and on the CPU (``INLINE_PREDICT_FEATURES``), else
        on an inference thread (one of ``limiter``'s; the micro-batcher has taken its slot already)."""
        n = len(request)
        if n * model.features_per_sample <= INLINE_PREDICT_FEATURES and model.runs_on_cpu(n):
            return runtime.predict(model, request)
        return await anyio.to_thread.run_sync(runtime.predict, model, request, limiter=limiter)

    async def run(self, work: Callable[..., T], *args, inline: bool, **kwargs) -> T:
        """A codec's CPU work: here when ``inline`` (small), else on the codec thread."""
        if inline:
            return work(*args, **kwargs)
        try:
            return await anyio.to_thread.run_sync(partial(work, *args, **kwargs), limiter=self._codec_limiter)
        except BaseException as error:
            # Raised on a thread, it comes back in a reference cycle (its traceback holds the frame that
            # awaited the future holding it): the locals of its frames (a body, its pieces) would live until
            # a full garbage collection, which gc.freeze (service.reload) makes rare. Cleared, they go now.
            traceback.clear_frames(error.__traceback__)
            raise


def _decodes_inline(text_bytes: int, tensor_bytes: int) -> bool:
    return text_bytes <= INLINE_BODY_BYTES and tensor_bytes <= INLINE_TENSOR_BYTES


def _check_answer(model: LoadedModel, samples: int, limit: int) -> None:
    """An answer of at most ``limit`` numbers, or a 413 that says how many samples fit, before any work."""
    per_sample = model.values_per_sample
    if samples * per_sample > limit:
        raise PayloadTooLarge(
            f"{samples} samples make an answer of {samples * per_sample} numbers ({per_sample} a sample of "
            f"model {model.name!r}); at most {limit} are answered (DBF_MAX_ANSWER_VALUES): send at most "
            f"{limit // per_sample} samples a request"
        )


def _check_coverage(model: LoadedModel, coverage: float) -> None:
    """A coverage the model's calibration set supports, or a 400 that says the most it does."""
    if model.calibration is None:
        raise InvalidInput(
            f"model {model.name!r} has no calibration (manifest schema 1): it gives no prediction sets"
        )
    try:
        conformal_rank(model.calibration.calibration_scores.size, coverage=coverage)
    except CoverageError as error:
        raise InvalidInput(str(error)) from None
