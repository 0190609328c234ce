"""Where a model's heads run: on each execution provider that can run them (CUDA, the CPU), timed at load at a
few batch sizes; a batch then runs on the provider that was fastest at its size (``DBF_DEVICE=auto``), or on
the one ``DBF_DEVICE`` names. Tiny heads lose more to a GPU's copies and launches than they gain, big ones
win from a few samples on: only a measurement on the box that serves them can tell.

And how a head runs there: on the CPU, :meth:`onnxruntime.InferenceSession.run`; on CUDA, through an
IOBinding whose host buffers are allocated once per thread and reused, the outputs copied back once, into
them (:class:`BoundHead`).
"""

from __future__ import annotations

import ctypes
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import onnxruntime

log = logging.getLogger("dbf.placement")

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"

BATCH_SIZES = (1, 16, 256, 1024)
"""The batch sizes timed at load: one sample, a micro-batch, and the big requests of binary clients."""
TIMED_RUNS = 5
"""Runs timed per provider and batch size (after one to warm up); the fastest counts."""

Timer = Callable[[str, Callable[[int], object], int], float]
"""A timing source: ``(provider, run, n)`` -> seconds ``run(n)`` (all of a model's heads on a batch of ``n``
samples) takes on ``provider``. :func:`clock` times it; a test gives fake timings."""


class Head(Protocol):
    """One view's head as the runtime calls it: features ``(n, dim)`` in, ``[evidence (n, K)]`` out, and the
    range excess ``(n,)`` after it from heads exported with range checks."""

    def run(self, features: np.ndarray) -> list[np.ndarray]: ...


@dataclass(frozen=True)
class Placement:
    """Which provider runs a batch of a model's heads, by the batch's size: ``buckets`` holds, in ascending
    order, the largest batch each provider runs (None: every bigger one too); ``timings`` what decided it
    (provider -> batch size -> seconds; empty where nothing was measured), ``reason`` why so."""

    buckets: tuple[tuple[int | None, str], ...]
    reason: str
    timings: Mapping[str, Mapping[int, float]] = field(default_factory=dict)

    def provider(self, samples: int) -> str:
        """The provider that runs a batch of ``samples``."""
        for most, provider in self.buckets:
            if most is None or samples <= most:
                return provider
        raise AssertionError("the last bucket takes every size")

    @property
    def providers(self) -> tuple[str, ...]:
        """The providers in use, in the order of the batch sizes they run (the smallest batches' first)."""
        return tuple(dict.fromkeys(provider for _, provider in self.buckets))

    def describe(self) -> dict[str, Any]:
        """As ``/v1/models`` and the v2 model metadata show it: each provider's batch sizes (``to_samples``
        None: no end), why, and the timings (milliseconds per batch) that decided it."""
        return {
            "reason": self.reason,
            "batches": [
                {"provider": provider, "from_samples": first, "to_samples": most}
                for provider, first, most in self._ranges()
            ],
            "timings_ms": {
                provider: {str(n): round(seconds * 1000, 4) for n, seconds in sizes.items()}
                for provider, sizes in self.timings.items()
            },
        }

    def sizes(self) -> list[tuple[str, str]]:
        """Each provider and the batch sizes it runs, as text (``1-16``, ``17+``), small batches first."""
        return [
            (provider, f"{first}-{most}" if most is not None else f"{first}+")
            for provider, first, most in self._ranges()
        ]

    def _ranges(self) -> list[tuple[str, int, int | None]]:
        """Each bucket's provider, smallest batch and largest (None: no end)."""
        firsts = [1, *(most + 1 for most, _ in self.buckets[:-1])]
        return [(provider, first, most) for first, (most, provider) in zip(firsts, self.buckets, strict=True)]

    def __str__(self) -> str:
        """As the log says it: where each batch size runs, why, and the timings that decided it."""
        sizes = self.sizes()
        where = (
            f"every batch on {sizes[0][0]}"
            if len(sizes) == 1
            else ", ".join(f"{samples} samples on {provider}" for provider, samples in sizes)
        )
        timed = "".join(
            f"; {provider}: " + ", ".join(f"{n} in {seconds * 1000:.3g} ms" for n, seconds in by_size.items())
            for provider, by_size in self.timings.items()
        )
        return f"{where} ({self.reason}{timed})"

    def to_json(self) -> dict[str, Any]:
        """What :meth:`from_json` reads back (a worker process's copy of its supervisor's placement)."""
        timings = {p: {str(n): t for n, t in by_size.items()} for p, by_size in self.timings.items()}
        return {
            "buckets": [list(bucket) for bucket in self.buckets],
            "reason": self.reason,
            "timings": timings,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], reason: str) -> Placement:
        timings = {p: {int(n): t for n, t in by_size.items()} for p, by_size in data["timings"].items()}
        return cls(tuple((most, provider) for most, provider in data["buckets"]), reason, timings)


def fixed(provider: str, reason: str) -> Placement:
    """Every batch on ``provider``."""
    return Placement(((None, provider),), reason)


def decide(
    runs: Mapping[str, Callable[[int], object]], timer: Timer, sizes: Sequence[int] = BATCH_SIZES
) -> Placement:
    """Time ``runs`` (provider -> a run of the model's heads on a batch of ``n``) at each of ``sizes``, and
    place each batch on the provider fastest at the timed size nearest to it (on a log scale: the switch
    between two timed sizes lies at their geometric mean). A tie goes to the CPU: no device memory, no
    copies."""
    sizes = sorted(sizes)
    timings = {provider: {n: float(timer(provider, run, n)) for n in sizes} for provider, run in runs.items()}
    fastest = [min(timings, key=lambda provider, n=n: (timings[provider][n], provider != CPU)) for n in sizes]
    buckets: list[tuple[int | None, str]] = []
    for i, provider in enumerate(fastest):
        most = math.isqrt(sizes[i] * sizes[i + 1]) if i + 1 < len(sizes) else None
        if buckets and buckets[-1][1] == provider:
            buckets[-1] = (most, provider)  # the same provider as the sizes below: one bucket
        else:
            buckets.append((most, provider))
    return Placement(tuple(buckets), "measured", timings)


def clock(provider: str, run: Callable[[int], object], n: int) -> float:
    """The fastest of :data:`TIMED_RUNS` runs of ``run(n)``, after one that warms up (the first run of a
    session, or of a new batch size on CUDA, allocates and picks kernels)."""
    run(n)
    best = math.inf
    for _ in range(TIMED_RUNS):
        started = time.perf_counter()
        run(n)
        best = min(best, time.perf_counter() - started)
    return best


class SessionHead:
    """A head on the CPU: :meth:`onnxruntime.InferenceSession.run`, which returns arrays of its own."""

    __slots__ = ("outputs", "session")

    def __init__(self, session: onnxruntime.InferenceSession, outputs: list[str]) -> None:
        self.session, self.outputs = session, outputs

    def run(self, features: np.ndarray) -> list[np.ndarray]:
        return self.session.run(self.outputs, {"features": features})


class BoundHead:
    """A head run through an IOBinding: the features go into a host buffer and from there to the device, the
    outputs come back once, into host buffers; the buffers are allocated once per thread (inference threads
    run heads concurrently) and grown to the next power of two past the largest batch seen, never per run.
    The arrays :meth:`run` returns are views of those buffers, valid until this thread's next run of this
    head: the runtime copies them into its evidence at once.

    The session runs where its provider does (the same code runs on the CPU provider); ``allocate`` gives a
    host buffer of a shape (page-locked ones, where the CUDA provider offers them, are copied to and from
    the GPU directly, without the driver's staging copy).
    """

    def __init__(
        self,
        session: onnxruntime.InferenceSession,
        outputs: list[str],
        *,
        allocate: Callable[[tuple[int, ...]], np.ndarray] | None = None,
    ) -> None:
        self.session, self.outputs = session, outputs
        self.allocate = allocate or (lambda shape: np.empty(shape, dtype=np.float32))
        self.dim = session.get_inputs()[0].shape[1]
        self.widths = [
            output.shape[1] if len(output.shape) == 2 else None for output in session.get_outputs()
        ]
        # Each output bound as the type it is: a head may give float64 or float16 evidence (the runtime casts
        # it), and one bound to a float32 buffer failed every run.
        self.types = [OUTPUT_TYPES.get(output.type, np.float32) for output in session.get_outputs()]
        self._local = threading.local()

    def run(self, features: np.ndarray) -> list[np.ndarray]:
        n = len(features)
        buffers = self._buffers(n)
        host_input, binding = buffers.input[:n], buffers.binding
        host_input[...] = features
        binding.bind_input("features", "cpu", 0, np.float32, host_input.shape, host_input.ctypes.data)
        answers = []
        for name, buffer in zip(self.outputs, buffers.outputs, strict=True):
            answer = buffer[:n]
            binding.bind_output(name, "cpu", 0, answer.dtype.type, answer.shape, answer.ctypes.data)
            answers.append(answer)
        binding.synchronize_inputs()  # the copy to the device is done before the graph reads it
        self.session.run_with_iobinding(binding)
        binding.synchronize_outputs()  # and the copy back before the caller reads the answers
        return answers

    def _buffers(self, n: int) -> _Buffers:
        buffers = getattr(self._local, "buffers", None)
        if buffers is None or len(buffers.input) < n:
            rows = 1 << max(n - 1, 0).bit_length()
            buffers = _Buffers(
                binding=self.session.io_binding() if buffers is None else buffers.binding,
                input=self.allocate((rows, self.dim)),
                outputs=[
                    self._output_buffer((rows,) if width is None else (rows, width), kind)
                    for width, kind in list(zip(self.widths, self.types, strict=True))[: len(self.outputs)]
                ],
            )
            self._local.buffers = buffers
        return buffers

    def _output_buffer(self, shape: tuple[int, ...], kind: type) -> np.ndarray:
        # ``allocate`` gives float32 buffers (page-locked where it can); an output of another type, its own.
        return self.allocate(shape) if kind is np.float32 else np.empty(shape, dtype=kind)


OUTPUT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int16)": np.int16,
    "tensor(int8)": np.int8,
    "tensor(uint64)": np.uint64,
    "tensor(uint32)": np.uint32,
    "tensor(uint16)": np.uint16,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}
"""The numpy type of each numeric output type a head may give (the load's probe refuses the others)."""


@dataclass
class _Buffers:
    binding: onnxruntime.IOBinding
    input: np.ndarray
    outputs: list[np.ndarray]


def page_locked_allocator() -> Callable[[tuple[int, ...]], np.ndarray] | None:
    """Host buffers in page-locked memory from the CUDA provider's allocator, when onnxruntime lists the
    provider's device and gives host-accessible memory for it; None otherwise (plain numpy buffers then)."""
    try:
        devices = [device for device in onnxruntime.get_ep_devices() if device.ep_name == CUDA]
        info = devices[0].memory_info(onnxruntime.OrtDeviceMemoryType.HOST_ACCESSIBLE) if devices else None
    except (AttributeError, IndexError, RuntimeError):  # an onnxruntime without the device API
        info = None
    if info is None:
        return None

    def allocate(shape: tuple[int, ...]) -> np.ndarray:
        value = onnxruntime.OrtValue.ortvalue_from_shape_and_type(list(shape), np.float32, memory_info=info)
        memory = (ctypes.c_float * math.prod(shape)).from_address(value.data_ptr())
        memory.owner = value  # the value owns the memory: it lives as long as the array (and its views)
        return np.ctypeslib.as_array(memory).reshape(shape)

    try:
        allocate((1, 1))  # at load, not at a request's first run: an allocator that fails is not used
    except Exception as error:  # onnxruntime raises its own exception types
        log.warning("page-locked host buffers unavailable (%s): using ordinary ones", error)
        return None
    return allocate
