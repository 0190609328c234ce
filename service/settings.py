"""The service's one configuration object, read from ``DBF_*`` environment variables and the CLI."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from manifest import MAX_VIEW_DIM


class Settings(BaseSettings):
    """Every field can be set as ``DBF_<NAME>`` (e.g. ``DBF_PORT=9000``, ``DBF_REQUIRE_GPU=true``)."""

    model_config = SettingsConfigDict(env_prefix="DBF_")

    host: str = Field(default="127.0.0.1", description="address to listen on (0.0.0.0: every interface)")
    port: int = Field(default=8000, ge=1, le=65535, description="HTTP port")
    # The Open Inference Protocol over gRPC (service/grpc_server.py), on DBF_HOST too; 8081 as KServe's and
    # MLServer's. 0 serves no gRPC.
    grpc_port: int = Field(default=8081, ge=0, le=65535, description="gRPC port; 0: no gRPC")
    workers: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        default=1,
        description="uvicorn worker processes (metrics add up across them); auto: one per core this process "
        "may use (its CPU affinity, and its cgroup's CPU quota if lower)",
    )
    model_dir: Path = Field(default=Path("models"), description="the model repository: one folder per model")
    default_model: str = Field(default="handwritten", description="the model POST /predict asks")
    max_samples: int = Field(default=1024, ge=1, description="samples per request; more is a 413")
    # Numbers in one answer: samples x one sample's (its model's classes and views make them, by the output
    # registry: service/outputs.py). Checked before any head runs, it bounds a request's memory and time
    # however many classes a model has; a model whose one sample passes it is refused at load. The default
    # takes DBF_MAX_SAMPLES samples of every committed model.
    max_answer_values: int = Field(
        default=1 << 20, ge=1, description="numbers in one answer; more is a 413 (a model of more is refused)"
    )
    # Unset, the limit is this or, if more, what DBF_MAX_SAMPLES samples of the largest model served take
    # as JSON with every number at full length (service.repository.body_bytes): every request of at most
    # DBF_MAX_SAMPLES samples fits, in binary and in JSON. Set, it is the limit, whatever the models.
    max_body_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=1,
        description="request body size; more is a 413 (unset: sized by the models)",
    )
    # Slow bodies: the whole body within this many seconds, and on average at no less than this many bytes a
    # second after its first ten (a stalled or trickling upload gets 408 and its connection closed).
    # Requests take a predict slot only once their body is in, so slow senders never crowd out the others.
    # The rate holds for answers too: an answer that its client does not take at this rate, over each
    # DBF_IDLE_TIMEOUT_SECONDS, is dropped with its connection (service/server.py).
    body_timeout_seconds: float = Field(default=30.0, gt=0, description="a body's longest time to arrive")
    body_min_bytes_per_second: int = Field(
        default=1024,
        ge=0,
        description="a body's slowest average rate after its first 10 s, and an answer's (0: any)",
    )
    # Bytes of request bodies buffered at once, across requests (as they arrive, decompressed bytes counted
    # too; a declared length past it is a 413 at once); beyond it, 503 overloaded with Retry-After. With
    # bodies of at most DBF_MAX_BODY_BYTES, the default keeps concurrent big uploads within a 1 GiB pod
    # (docs: limits). So many bytes of answers, too, may wait for clients that have not taken them (HTTP:
    # beyond it, the connections that have held theirs longest are dropped; gRPC: new calls are shed).
    body_memory_bytes: int = Field(
        default=128 * 1024 * 1024,
        ge=1,
        description="request body bytes buffered at once, all requests (and, apart, answers held)",
    )
    # Load shedding: requests past this many in flight (queued or running) get 503 + Retry-After at once,
    # rather than waiting in an unbounded queue until their clients time out.
    # The largest view a model may declare: a request that leaves a view out has it sent as zeros, up to
    # DBF_MAX_SAMPLES x this many float32 per view (256 MiB at the defaults).
    max_view_dim: int = Field(
        default=MAX_VIEW_DIM, ge=1, description="a manifest's largest view dim; more refuses it"
    )
    max_in_flight: int = Field(default=64, ge=1, description="concurrent predict requests; more is a 503")
    # The views' agreement (dbf_view_agreed_total) is a monitoring signal: its alert needs a few hundred
    # samples in ten minutes, and counting every batch cost a one-sample predict a tenth of its time.
    agreement_interval_seconds: float = Field(
        default=0.05,
        ge=0,
        allow_inf_nan=False,
        description="a model's views' agreement is counted on one batch per this many seconds at most, on up "
        "to 16 of its samples; 0: on every sample",
    )
    retry_after_seconds: int = Field(
        default=1, ge=0, description="Retry-After of a load-shedding or not-ready 503"
    )
    # Micro-batching (service/batching.py): concurrent requests for the same model and fusion run together.
    batching: bool = Field(default=True, description="micro-batch concurrent small requests")
    batch_max_samples: int = Field(default=256, ge=1, description="samples in one micro-batch, at most")
    # At most a second, both: a batch waiting longer holds every request in it (infinity: for ever).
    batch_max_delay_ms: float = Field(
        default=0.0, ge=0, le=1000, description="a batch's longest wait for more"
    )
    # gRPC's calls reach the core one at a time (grpc.aio accepts a call, then receives its message, each a
    # completion of its own): without a wait, concurrent calls are never batched together. The wait is
    # taken in steps, again while the last brought more calls (service/batching.py): a lone call waits one.
    grpc_batch_delay_ms: float = Field(
        default=1.0, ge=0, le=1000, description="a batch holding a gRPC call waits this long for more"
    )
    grpc_batch_max_delay_ms: float = Field(
        default=3.0,
        ge=0,
        le=1000,
        description="and again while more came, this long in all at most (one wait at least)",
    )
    # A gRPC connection is told to go (GOAWAY) after this long, and closed, whatever it holds, once its calls
    # have had DBF_GRACEFUL_SHUTDOWN_SECONDS more to finish: gRPC offers no other way to drop a call whose
    # client does not take its answer (each holds it in memory). Clients reconnect by themselves.
    grpc_max_connection_age_seconds: float = Field(
        default=300.0, gt=0, description="a gRPC connection's longest life (its client reconnects)"
    )
    # Hot reload: POST /v1/admin/reload, or a poll of the model directory every this many seconds (0: off).
    reload_poll_seconds: float = Field(default=0.0, ge=0, description="seconds between polls (0: off)")
    # A reload not done by then is refused (409) and its load abandoned: a file that blocks on read (a hung
    # network mount) cannot hold the reload lock, or the shutdown, for ever.
    reload_timeout_seconds: float = Field(default=120.0, gt=0, description="a reload's longest time")
    # Bearer token for predict, model and admin endpoints and the API's documentation (/openapi.json, /docs,
    # /redoc); /health, /ready and /metrics stay open. Surrounding whitespace is stripped: a key from a file
    # or a Kubernetes secret often ends in a line break, which no client sends (nor can a bearer token hold).
    # Set but empty (``DBF_API_KEY=``, or a secret that did not materialise) refuses to start: treating it
    # as unset would open the endpoints an operator meant to close, as a key would lock everyone out. So
    # does a key that is not printable ASCII, which no client can send.
    api_key: SecretStr | None = Field(
        default=None, description="bearer token; surrounding whitespace (a trailing newline) is stripped"
    )
    require_gpu: bool = Field(default=False, description="refuse to start unless CUDA really runs the heads")
    # Where the heads run (service.placement): auto times each model's heads at load on every provider that
    # can run them (CUDA where it works, the CPU) and runs each batch where its size ran fastest; cuda or
    # cpu puts every batch there (cuda refuses to start when CUDA cannot run the heads).
    device: Literal["auto", "cuda", "cpu"] = Field(
        default="auto",
        description="where the heads run: auto (each batch where it ran fastest at load), cuda or cpu",
    )
    # Placements measured already (service.repository.handed_placements): python -m service --workers N
    # measures once and hands them to its workers. A model not in it, or whose heads changed, is measured.
    placement: str | None = Field(default=None, description="placements measured already (JSON; internal)")
    # onnxruntime's CUDA provider rounds MatMul's inputs to TF32 unless told not to: off, CUDA's answers
    # differ from the CPU's by float32 rounding only (the bound is to be measured on a GPU: README, GPU).
    cuda_tf32: bool = Field(default=False, description="let the CUDA provider use TF32 in MatMul")
    # Each view's onnxruntime session gets one thread and no spinning: the heads are small matrix products,
    # a batch runs its views one after another (in one inference thread, or on the event loop when small),
    # and concurrency comes from running batches in parallel (inference_threads), so per-session pools would
    # only oversubscribe the cores.
    # More than the worker's share of the cores is not given (session_threads): N workers' sessions
    # together would run more threads than there are cores.
    onnx_threads: int = Field(
        default=1,
        ge=1,
        description="threads of each view's onnxruntime session (at most the cores over the workers)",
    )
    # The cores this process may use, not the host's: a container's --cpus or a pod's CPU limit would
    # otherwise get a thread per core of the machine, and be throttled.
    inference_threads: int = Field(
        default_factory=lambda: available_cores(),
        ge=1,
        description="batches run at once (the cores this process may use: affinity, cgroup CPU quota)",
    )
    log_level: Literal["debug", "info", "warning", "error", "critical"] = Field(
        default="info", description="debug, info, warning, error or critical (any case)"
    )
    graceful_shutdown_seconds: float = Field(
        default=30.0, gt=0, description="in-flight requests' time to finish"
    )
    # Connection-level limits (service/server.py), per worker process.
    max_header_bytes: int = Field(
        default=32 * 1024, ge=1024, description="request line and header fields; more is a 431 (or 414)"
    )
    max_header_count: int = Field(default=100, ge=1, description="header fields per request; more is a 431")
    header_timeout_seconds: float = Field(
        default=10.0, gt=0, description="a request head's time to arrive in full, from its first byte; 408"
    )
    # uvicorn's keep-alive timeout (5 s there), and before the first request too. Longer than common
    # clients' pool expiry (httpx: 5 s), so that a client drops an idle connection before the service
    # closes it, rather than reuse it just as it closes (a failed request: seen with 5 s on both sides).
    # Behind a proxy that keeps upstream connections alive, set it above the proxy's idle timeout too.
    idle_timeout_seconds: float = Field(
        default=15.0, gt=0, description="a connection waiting for a request is closed after this"
    )
    max_connections: int = Field(
        default=1024, ge=1, description="open connections; over it the stalest idle one is closed"
    )

    @property
    def session_threads(self) -> int:
        """Each onnxruntime session's intra-op threads in this worker (:func:`session_threads`)."""
        workers = available_cores() if self.workers == "auto" else self.workers
        return session_threads(self.onnx_threads, workers, available_cores())

    @field_validator("model_dir", mode="before")
    @classmethod
    def _model_dir_given(cls, path: object) -> object:
        if isinstance(path, str) and not path.strip():  # Path("") is ".": the working directory, unasked
            raise ValueError("set but empty: give the model repository's path, or unset it for models/")
        return path

    @field_validator("host")
    @classmethod
    def _host_given(cls, host: str) -> str:
        if not host.strip():  # uvicorn reads "" as every interface: an unset ${HOST} would open the service
            raise ValueError("set but empty: give an address to listen on, or unset it for 127.0.0.1")
        return host

    @field_validator("log_level", mode="before")
    @classmethod
    def _level_in_lower_case(cls, level: object) -> object:
        return level.strip().lower() if isinstance(level, str) else level

    @field_validator("api_key")
    @classmethod
    def _api_key_stripped(cls, key: SecretStr | None) -> SecretStr | None:
        if key is None:
            return None
        stripped = key.get_secret_value().strip()
        if not stripped:
            raise ValueError("set but empty: give it a key, or unset it to leave the endpoints open")
        if not all(" " <= character <= "~" for character in stripped):
            # gRPC metadata refuses such a value, and HTTP clients send it as UTF-8 where the service reads
            # Latin-1: a key no client sends locks everyone out as surely as an empty one.
            raise ValueError(
                "holds a character that is not printable ASCII (an accent, a line break): no client can "
                "send it as a bearer token; use letters, digits and punctuation"
            )
        return SecretStr(stripped)


def available_cores(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """The cores this process may run on: its CPU affinity, or its cgroup's CPU quota rounded up, if lower (as
    a container's ``--cpus`` or a pod's CPU limit sets it: cgroup v2's ``cpu.max``, or v1's
    ``cpu/cpu.cfs_quota_us`` over ``cpu.cfs_period_us``, still the hierarchy of many hosts)."""
    if not hasattr(os, "sched_getaffinity"):  # macOS and Windows: no affinity, no cgroups
        return os.cpu_count() or 1
    cores = len(os.sched_getaffinity(0))
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()
    except (OSError, ValueError):  # no cgroup v2 here, or not readable: v1's files, if any
        try:
            quota = (cgroup / "cpu" / "cpu.cfs_quota_us").read_text().strip()
            period = (cgroup / "cpu" / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            return cores
    try:
        quota_us, period_us = int(quota), int(period)  # "max" (v2) is no quota; so is -1 (v1)
    except ValueError:
        return cores
    if quota_us <= 0 or period_us <= 0:
        return cores
    return max(1, min(cores, -(-quota_us // period_us)))


def session_threads(onnx_threads: int, workers: int, cores: int) -> int:
    """``DBF_ONNX_THREADS``, at most the worker's share of the cores (``cores // workers``, one at least):
    the workers' sessions together then run no more threads than the process has cores. Each worker
    process has its own sessions, and ``--workers auto`` already starts one per core: there, and with two
    workers on two cores, ``DBF_ONNX_THREADS=2`` gave 4 threads to 2 cores.

    >>> session_threads(4, workers=2, cores=8), session_threads(4, workers=1, cores=2)
    (4, 2)
    >>> session_threads(2, workers=2, cores=2), session_threads(1, workers=3, cores=2)
    (1, 1)
    """
    return min(onnx_threads, max(1, cores // workers))


# DBF_* variables read by others than the service: fit's data directory, and the test suite's knobs.
READ_ELSEWHERE = frozenset(
    {"DBF_DATA_DIR", "DBF_REQUIRE_DATA", "DBF_LOAD_TEST_SECONDS", "DBF_IMAGE_CACHE", "DBF_DEBIAN_MIRROR"}
)


def unknown_variables(environment: Mapping[str, str]) -> list[str]:
    """``DBF_*`` variables of ``environment`` that set nothing, each with the setting it may have meant: a
    typo (``DBF_API_KEYS``) would otherwise leave its setting at its default (here: no key, the API open).

    >>> unknown_variables({"DBF_API_KEYS": "k", "DBF_PORT": "9000", "DBF_DATA_DIR": "data", "HOME": "/"})
    ['DBF_API_KEYS (did you mean DBF_API_KEY?)']
    """
    known = {f"DBF_{name.upper()}" for name in Settings.model_fields}
    found = []
    for name in sorted(environment):
        if name.upper().startswith("DBF_") and name.upper() not in known | READ_ELSEWHERE:
            close = difflib.get_close_matches(name.upper(), sorted(known), n=1)
            found.append(f"{name} (did you mean {close[0]}?)" if close else name)
    return found
