"""The model repository: find manifests, verify every file, load one onnxruntime session per view.

Nothing half-loaded is served: :func:`load_repository` either returns every model verified and loaded, or
raises :class:`ModelLoadError` naming the file at fault.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import stat
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property, partial
from pathlib import Path

import numpy as np
import onnxruntime
from pydantic import ValidationError

from calibration import ModelCalibration
from fusion import METHODS
from manifest import Manifest
from service.inference import ModelSignature, ViewSpec
from service.json_numbers import unique_keys
from service.metrics import AgreementSampler
from service.outputs import answer_values
from service.placement import (
    CPU,
    CUDA,
    BoundHead,
    Head,
    Placement,
    SessionHead,
    Timer,
    clock,
    decide,
    fixed,
    page_locked_allocator,
)
from service.settings import Settings

log = logging.getLogger("dbf.repository")

RANGE_EXCESS = "range_excess"
HEAD_OUTPUTS = (["evidence"], ["evidence", RANGE_EXCESS])
"""What a head may give: evidence, and from heads exported with range checks its range excess."""


class ModelLoadError(RuntimeError):
    """A manifest or model file is missing, invalid, tampered with, or does not load; the message names it."""


@dataclass(frozen=True)
class LoadedModel:
    manifest: Manifest
    directory: Path
    heads: dict[str, dict[str, Head]] = field(repr=False)  # provider -> view -> its head there
    providers: dict[str, str]  # view -> the providers that run it (comma-separated, small batches' first)
    calibration: ModelCalibration | None = field(default=None, repr=False)  # None: manifest schema 1
    # view -> what its head gives: evidence, and range_excess unless exported before range checks existed
    outputs: dict[str, list[str]] = field(default_factory=dict, repr=False)
    placement: Placement = field(default_factory=lambda: fixed(CPU, "not measured"))
    # which batches have their views' agreement counted (DBF_AGREEMENT_INTERVAL_SECONDS)
    agreement: AgreementSampler = field(default_factory=lambda: AgreementSampler(0.0), repr=False)

    @property
    def name(self) -> str:
        return self.manifest.name

    @cached_property
    def signature(self) -> ModelSignature:
        """What the protocols need to know of this model (its views, classes, version, fusion defaults)."""
        manifest = self.manifest
        return ModelSignature(
            name=manifest.name,
            version=manifest.version,
            views=tuple(ViewSpec(view.name, view.dim) for view in manifest.views),
            classes=tuple(manifest.classes),
            method=manifest.fusion.method,
            lam=manifest.fusion.lam,
            methods=METHODS,
            default_coverage=None if self.calibration is None else self.calibration.default_coverage,
            max_coverage=None if self.calibration is None else self.calibration.max_coverage,
            placement=str(self.placement),
        )

    def heads_for(self, samples: int) -> dict[str, Head]:
        """View -> its head on the provider placed to run a batch of ``samples``."""
        return self.heads[self.placement.provider(samples)]

    def runs_on_cpu(self, samples: int) -> bool:
        """Whether a batch of ``samples`` runs its heads on the CPU (by the placement: with ``auto``, small
        batches may run there while big ones go to the GPU)."""
        return self.placement.provider(samples) == CPU

    @cached_property
    def agreeing_views(self) -> tuple[slice | list[int], tuple[str, ...]] | None:
        """The views whose agreement with the other views fused is counted: those the manifest has a clean
        rate for (``view_agreement``), as an index of the view axis (a slice where all are: no copy) and
        their names; None where it has none, or one view only (it has no other to agree with)."""
        rates, views = self.manifest.view_agreement, self.manifest.views
        if not rates or len(views) < 2:
            return None
        measured = [v for v, view in enumerate(views) if view.name in rates]
        index = slice(None) if len(measured) == len(views) else measured
        return index, tuple(views[v].name for v in measured)

    @cached_property
    def features_per_sample(self) -> int:
        """Feature values in one complete sample (every view's)."""
        return int(self.signature.view_dims.sum())

    @cached_property
    def values_per_sample(self) -> int:
        """Numbers in one sample's answer (:func:`service.outputs.answer_values`): what it costs."""
        return answer_values(len(self.manifest.classes), len(self.manifest.views))


@dataclass(frozen=True)
class Repository:
    models: dict[str, LoadedModel]
    default: str | None  # None: requests must name their model (see _default_model)
    max_body_bytes: int = 8 * 1024 * 1024  # the request body limit these models make (body_limit)

    def get(self, name: str | None = None) -> LoadedModel | None:
        """The model called ``name``, or the default one for None; None if there is no such model."""
        name = self.default if name is None else name
        return None if name is None else self.models.get(name)


def repository_fingerprint(model_dir: Path) -> tuple:
    """What changes when anything the loader reads is added, removed, replaced or rewritten: the entries of
    ``model_dir`` and of its folders (a model's files), symlinks followed.

    A symlink counts by where it points and by what it points to (its target's inode, size and times), so
    that adding a symlinked model, swapping a link atomically (``ln -sfn v2 tmp && mv -T tmp current``, of
    a model or of ``model_dir`` itself) and editing a file behind a link are all seen; a link to nowhere or
    in a loop by where it points, so that the reload it brings says why its model is refused. A file's
    change time (ctime) counts beside its modification time, which ``cp -p`` or ``touch -r`` set back. Two
    levels deep and each folder once: a symlink loop ends there. Hidden entries are not read
    (:func:`find_manifests`), nor the files of a folder without a ``manifest.json``, which the loader does
    not read either.
    """
    fingerprint: list[tuple] = [("", os.path.realpath(model_dir))]
    folders_seen: set[tuple[int, int]] = set()

    def look(folder: Path, depth: int) -> None:
        try:
            info = folder.stat()
            entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
        except OSError:  # removed (or swapped) while we looked: the next look sees what is there
            return
        if (info.st_dev, info.st_ino) in folders_seen:
            return
        folders_seen.add((info.st_dev, info.st_ino))
        if depth < 2 and not any(entry.name == "manifest.json" for entry in entries):
            # No model: its files' changes are none of the loader's. Counted, a folder linked to /proc (or
            # one of logs) reloaded every model at every poll.
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue
            link = None
            try:
                link = os.readlink(entry.path) if entry.is_symlink() else None
                info = entry.stat()  # of the target, for a symlink
            except OSError:  # gone, or a link to nowhere or in a loop: the load refuses that one, saying why
                if link is not None:
                    fingerprint.append((entry.path, link, None))
                continue
            folder_entry = stat.S_ISDIR(info.st_mode)
            # A folder by what it is, not by its time or size: those change with its entries, which are
            # looked at where they count (a model's files), and which are none of the loader's elsewhere.
            # A file's ctime too: a rewrite in place given its old time back (cp -p, touch -r) keeps the rest.
            changes = (
                (None, None, None) if folder_entry else (info.st_mtime_ns, info.st_ctime_ns, info.st_size)
            )
            kind = stat.S_IFMT(info.st_mode)
            fingerprint.append((entry.path, link, kind, info.st_dev, info.st_ino, *changes))
            if depth > 1 and folder_entry:
                look(Path(entry.path), depth - 1)

    look(model_dir, 2)
    return tuple(fingerprint)


def find_manifests(model_dir: Path) -> list[Path]:
    """``model_dir/manifest.json`` if it is one model, else the ``manifest.json`` of each of its folders,
    sorted. A folder without one is not a model, nor is a hidden folder (staging, ``..data`` of a Kubernetes
    volume) or a volume's ``lost+found``.

    A folder that is there but cannot be read (no permission, a symlink to nowhere or in a loop, gone while
    we looked) is a :class:`ModelLoadError` naming it: passed over, it would silently drop the model it
    holds.
    """
    try:
        names = _names(model_dir)
    except OSError as error:
        raise ModelLoadError(f"{model_dir}: cannot read the model directory ({error.strerror})") from error
    if "manifest.json" in names:
        return [model_dir / "manifest.json"]
    manifests = []
    for name in sorted(names):
        if name.startswith(".") or name == "lost+found":
            continue
        folder = model_dir / name
        try:
            inside = _names(folder)
        except NotADirectoryError:  # a file beside the models (a schema, a README)
            continue
        except OSError as error:
            raise ModelLoadError(
                f"{folder}: cannot read this model folder ({error.strerror}{_link_target(folder)})"
            ) from error
        if "manifest.json" in inside:
            manifests.append(folder / "manifest.json")
    return manifests


def _names(folder: Path) -> set[str]:
    with os.scandir(folder) as entries:
        return {entry.name for entry in entries}


def _link_target(path: Path) -> str:
    try:
        return f", a symlink to {os.readlink(path)}"
    except OSError:  # not a symlink (or gone)
        return ""


def read_manifest(path: Path) -> tuple[Manifest, dict[str, bytes]]:
    """Validate ``path`` against the schema and every head file against its SHA-256.

    Returns the manifest and the verified bytes per view: sessions are built from these very bytes, so a
    file changed after the check is never loaded. A model folder replaced while it was read (``fit`` swaps
    the new model's folder for the old one in one exchange, then removes the old) is read again: its old
    manifest and its new heads are no fault of either version.
    """
    for _ in range(FOLDER_SWAPS_READ_AGAIN):
        folder = _identity(path.parent)
        try:
            return _read_model(path)
        except ModelLoadError:
            if _identity(path.parent) == folder:
                raise
    return _read_model(path)


FOLDER_SWAPS_READ_AGAIN = 3
"""How many times a model whose folder was swapped while it was read is read again: a folder swapped at
every read is refused, with what the last read found."""


def _identity(folder: Path) -> tuple[int, int] | None:
    """The folder that ``folder`` names now (device and inode); None where there is none."""
    try:
        info = os.stat(folder)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _read_model(path: Path) -> tuple[Manifest, dict[str, bytes]]:
    content = _read_file(path, "manifest", limit=MAX_MANIFEST_BYTES)
    try:
        # Strict: a number written as a string ("dim": "6") is a manifest not written by export.
        manifest = Manifest.model_validate_json(content, strict=True)
        # pydantic keeps a repeated key's last value: a second "name" would serve the model under it.
        json.loads(content, object_pairs_hook=unique_keys)
    except ValidationError as error:
        # Said without the values it quotes: a manifest linked to a secret (an API key's file, a private key)
        # had its first and last bytes written in the log and the 409.
        unquoted = ValidationError.from_exception_data(error.title, error.errors(), hide_input=True)
        raise ModelLoadError(f"{path}: invalid manifest: {unquoted}") from None
    except ValueError as error:
        raise ModelLoadError(f"{path}: invalid manifest: {error}") from error
    verified = {}
    for view in manifest.views:
        file = path.parent / view.file
        content = _read_file(file, "model file", limit=MAX_HEAD_BYTES)
        digest = hashlib.sha256(content).hexdigest()
        if digest != view.sha256:
            raise ModelLoadError(f"{file}: checksum mismatch (manifest {view.sha256}, file {digest})")
        verified[view.name] = content
    return manifest, verified


MAX_MANIFEST_BYTES = 16 << 20
"""The largest manifest read: parsed, one takes about ten times its size in memory, and one of a fit on
millions of samples (its conformal scores, one per calibration sample) is a few megabytes."""
MAX_HEAD_BYTES = (2 << 30) - 1
"""The largest head file read: protobuf's limit on one message, so no larger file is one ONNX model (one
that big keeps its tensors in external data, refused in :func:`_session`). Read whole, a sparse file of
3 GiB took a reload 21 s and the service's memory from 122 MiB to 3.2 GiB, only to fail its checksum."""


def _read_file(file: Path, what: str, *, limit: int) -> bytes:
    """The bytes of ``file`` if it is a regular file (or a symlink to one) of at most ``limit`` bytes, else
    :class:`ModelLoadError` naming it. Opened without blocking and checked before any read: a FIFO or a
    device would block the load for ever (holding the reload lock), or never end; a file larger than
    ``limit`` (a sparse one of terabytes) is refused by its size, unread."""
    try:
        descriptor = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise ModelLoadError(f"{file}: cannot read {what} ({error.strerror})") from error
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            kind = _KINDS.get(stat.S_IFMT(info.st_mode), "a special file")
            raise ModelLoadError(f"{file}: cannot read {what} ({kind}, not a regular file)")
        if info.st_size > limit:
            raise ModelLoadError(f"{file}: {what} of more than {limit:,} bytes, more than any model's")
        with open(descriptor, "rb", closefd=False) as handle:
            # Its size and one byte more, to see it grow: a read of up to the limit reserved that much memory
            # first (2 GiB for every head, which strict overcommit or a ulimit -v refuses).
            content = handle.read(info.st_size + 1)
        if len(content) != info.st_size:
            raise ModelLoadError(
                f"{file}: cannot read {what} (its size says {info.st_size:,} bytes, the read gave "
                f"{'more' if len(content) > info.st_size else f'{len(content):,}'}: changed while read, or "
                "not a file on disk)"
            )
        return content
    except OSError as error:
        raise ModelLoadError(f"{file}: cannot read {what} ({error.strerror})") from error
    finally:
        os.close(descriptor)


_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def load_repository(
    settings: Settings, stop: threading.Event | None = None, *, timer: Timer = clock
) -> Repository:
    """Verify and load every model under ``settings.model_dir``; :class:`ModelLoadError` on any fault.

    ``stop`` set (the load given up: see :class:`service.reload.ModelLoads`), the load ends at its next
    file or session, with a :class:`ModelLoadError`. ``timer`` times the heads on each provider where there
    are several (:mod:`service.placement`).
    """
    # Each model read from where its folder leads now: a symlink swapped while we read cannot mix versions.
    paths = [path.parent.resolve() / path.name for path in find_manifests(settings.model_dir)]
    if not paths:
        raise ModelLoadError(
            f"{settings.model_dir}: no manifest.json (neither a model nor a repository of them)"
        )
    manifests = []
    for path in paths:  # verify everything before loading anything
        _check_stop(stop)
        manifests.append((path, *read_manifest(path)))
    for path, manifest, _ in manifests:
        _check_size(path, manifest, settings)
    _, first_manifest, first_bytes = manifests[0]
    providers = _providers(settings, first_bytes[first_manifest.views[0].name])
    models: dict[str, LoadedModel] = {}
    for path, manifest, verified in manifests:
        if manifest.name in models:
            first = next(p for p, m, _ in manifests if m.name == manifest.name)
            raise ModelLoadError(f"{path}: model name {manifest.name!r} is used twice (also by {first})")
        models[manifest.name] = model = _load_model(
            path, manifest, verified, providers, settings, stop, timer
        )
        log.info("loaded model %s from %s: %s", manifest.name, path.parent, model.placement)
        unchecked = [view for view, names in model.outputs.items() if RANGE_EXCESS not in names]
        if unchecked:
            log.warning(
                "model %s: the heads of %s give no range_excess (exported before range checks): features "
                "outside their training range are not detected there",
                manifest.name,
                ", ".join(unchecked),
            )
    default = _default_model(settings.default_model, models)
    max_body_bytes = body_limit(settings, models.values())
    if max_body_bytes > settings.body_memory_bytes:
        # A body past the whole budget is a 413 (no retry can help), and the operator should know which
        # model's requests it cuts short, and to how many samples.
        cut = [
            f"{m.manifest.name!r} in JSON past {json_samples(m.manifest, settings.body_memory_bytes)} samples"
            for m in models.values()
            if body_bytes(m.manifest, settings.max_samples) > settings.body_memory_bytes
        ]
        log.warning(
            "bodies of up to %d bytes are taken (DBF_MAX_BODY_BYTES) but %d are held at once "
            "(DBF_BODY_MEMORY_BYTES): larger bodies are refused, 413 (%s, at full length; binary tensors "
            "take 4 bytes a feature); raise the latter",
            max_body_bytes,
            settings.body_memory_bytes,
            "; ".join(cut) or "no model's request of DBF_MAX_SAMPLES samples",
        )
    return Repository(models=models, default=default, max_body_bytes=max_body_bytes)


def _default_model(configured: str, models: dict[str, LoadedModel]) -> str | None:
    """The model a request that names none asks: ``DBF_DEFAULT_MODEL``, else the only model; with several and
    none of them configured, none (such requests are refused) rather than one picked by name, which a reload
    adding a model would change under the clients' feet."""
    if configured in models:
        return configured
    if len(models) == 1:
        [only] = models
        log.info("default model %r not found; %r, the only model, is the default", configured, only)
        return only
    log.warning(
        "default model %r not found among %s: requests that name no model are refused; set DBF_DEFAULT_MODEL",
        configured,
        sorted(models),
    )
    return None


def _providers(settings: Settings, probe: bytes) -> list[str]:
    """The providers to load the heads on: the one ``DBF_DEVICE`` names, or for ``auto`` CUDA (where it
    really runs a session) and the CPU. :class:`ModelLoadError` where CUDA is required and cannot run."""
    if settings.device == "cpu" and not settings.require_gpu:
        return [CPU]
    usable = _cuda_usable(probe, settings)
    if settings.require_gpu and not usable:
        raise ModelLoadError(
            "DBF_REQUIRE_GPU is set but CUDA cannot run the heads (onnxruntime fell back to CPU)"
        )
    if settings.device == "cuda" and not usable:
        available = ", ".join(onnxruntime.get_available_providers())
        raise ModelLoadError(
            "DBF_DEVICE=cuda but CUDA cannot run the heads (onnxruntime's providers here: "
            f"{available}; CUDA's libraries may be missing): install onnxruntime-gpu with CUDA and cuDNN, or "
            "set DBF_DEVICE=auto or cpu"
        )
    return {"cpu": [CPU], "cuda": [CUDA], "auto": [CUDA, CPU] if usable else [CPU]}[settings.device]


def _load_model(
    path: Path,
    manifest: Manifest,
    verified: dict[str, bytes],
    providers: list[str],
    settings: Settings,
    stop: threading.Event | None,
    timer: Timer,
) -> LoadedModel:
    """One session per view on each of ``providers``, each checked; the placement measured between them
    where there are several."""
    heads: dict[str, dict[str, Head]] = {}
    outputs: dict[str, list[str]] = {}
    allocate = page_locked_allocator() if CUDA in providers else None
    for provider in providers:
        heads[provider] = {}
        for view in manifest.views:
            file = path.parent / view.file
            _check_stop(stop)
            session = _session(file, verified[view.name], settings, provider)
            outputs[view.name] = _check_signature(session, file, view.dim, len(manifest.classes))
            _check_probe(session, file, view.dim, len(manifest.classes), outputs[view.name])
            heads[provider][view.name] = (
                BoundHead(session, outputs[view.name], allocate=allocate)
                if provider == CUDA
                else SessionHead(session, outputs[view.name])
            )
    if len(providers) == 1:
        placement = fixed(
            providers[0],
            f"DBF_DEVICE={settings.device}"
            if settings.device != "auto"
            else "the only provider that runs here",
        )
    elif (given := _given_placement(settings, manifest, providers)) is not None:
        placement = given
    else:
        _check_stop(stop)
        views, batches = [(view.name, view.dim) for view in manifest.views], {}
        placement = decide({p: partial(_run_heads, heads[p], views, batches) for p in providers}, timer)
    joined = ",".join(placement.providers)
    return LoadedModel(
        manifest,
        path.parent,
        {provider: heads[provider] for provider in placement.providers},  # an unused provider's go now
        dict.fromkeys(outputs, joined),
        _calibration(path, manifest),
        outputs,
        placement,
        AgreementSampler(settings.agreement_interval_seconds),
    )


def handed_placements(repository: Repository) -> str:
    """The measured placements of ``repository``'s models as ``DBF_PLACEMENT`` takes them: what ``python -m
    service --workers N`` measures once, alone on the box, and hands to its workers, so that they neither
    time the heads all at once (each slowing the others' timings) nor disagree."""
    return json.dumps(
        {
            name: {"heads": _heads_digest(model.manifest), **model.placement.to_json()}
            for name, model in repository.models.items()
            if model.placement.reason == "measured"
        }
    )


def _given_placement(settings: Settings, manifest: Manifest, providers: list[str]) -> Placement | None:
    """The placement ``DBF_PLACEMENT`` hands this model, if it hands one for these very heads (not those of
    an earlier version) on providers loaded here."""
    if settings.placement is None:
        return None
    try:
        given = json.loads(settings.placement).get(manifest.name)
        if given is None or given["heads"] != _heads_digest(manifest):
            return None
        placement = Placement.from_json(given, "measured at start by the supervisor process")
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        log.warning("DBF_PLACEMENT unreadable (%s): measuring the placement of %s", error, manifest.name)
        return None
    return placement if set(placement.providers) <= set(providers) else None


def _heads_digest(manifest: Manifest) -> str:
    return hashlib.sha256("".join(view.sha256 for view in manifest.views).encode()).hexdigest()


def _run_heads(
    heads: dict[str, Head], views: list[tuple[str, int]], batches: dict[int, dict[str, np.ndarray]], n: int
) -> None:
    """Every view's head on a batch of ``n`` samples: standard normal features, drawn at the first run of a
    size (the warm-up: see :func:`service.placement.clock`) and kept in ``batches`` for the timed ones and
    the other providers', so that the timings are the heads' alone."""
    if n not in batches:
        rng = np.random.default_rng(n)
        batches[n] = {name: rng.standard_normal((n, dim), dtype=np.float32) for name, dim in views}
    for name, features in batches[n].items():
        heads[name].run(features)


JSON_BYTES_PER_FEATURE = 26
"""The most one feature takes in a JSON body: the longest float64 literal (``-2.2250738585072014e-308``)
and a separator (``, ``). A binary tensor's 4 bytes are fewer."""
BODY_ENVELOPE_BYTES = 64 * 1024
"""A body's room besides its samples: the JSON around them, a v2 request's header and parameters."""


def body_bytes(manifest: Manifest, samples: int) -> int:
    """The largest body of ``samples`` complete samples of ``manifest``'s model in any protocol it is served
    with (v1 JSON, which names each sample's views, is the largest): every number written at full length."""
    per_sample = sum(view.dim * JSON_BYTES_PER_FEATURE + len(view.name) + 8 for view in manifest.views) + 16
    return samples * per_sample + BODY_ENVELOPE_BYTES


def json_samples(manifest: Manifest, limit: int) -> int:
    """The most samples of ``manifest``'s model sure to fit in a body of ``limit`` bytes, as
    :func:`body_bytes` counts them."""
    return max(0, (limit - BODY_ENVELOPE_BYTES) // (body_bytes(manifest, 1) - BODY_ENVELOPE_BYTES))


def body_limit(settings: Settings, models: Iterable[LoadedModel]) -> int:
    """``DBF_MAX_BODY_BYTES`` where it is set; else its default or, if more, what the largest request of the
    largest model takes (:func:`body_bytes` of ``DBF_MAX_SAMPLES`` samples). One limit for every model:
    a body is bounded as it arrives, before its model is known."""
    if "max_body_bytes" in settings.model_fields_set:
        return settings.max_body_bytes
    return max([settings.max_body_bytes, *(body_bytes(m.manifest, settings.max_samples) for m in models)])


def message_limit(settings: Settings, models: Iterable[LoadedModel]) -> int:
    """The largest gRPC message taken: what ``DBF_MAX_SAMPLES`` samples of the widest model take as tensors
    (5 bytes a feature: fp32 contents unpacked, the most; raw and packed ones take 4) and
    :data:`BODY_ENVELOPE_BYTES` for the rest, within the body limit. A message is read whole before any
    check of ours, so this bounds what each concurrent call can hold; JSON's 26 bytes a number, which size
    the body limit, have no place in protobuf."""
    widest = max((sum(view.dim for view in m.manifest.views) for m in models), default=0)
    tensors = settings.max_samples * widest * 5 + BODY_ENVELOPE_BYTES
    return min(body_limit(settings, models), max(tensors, BODY_ENVELOPE_BYTES))


def _check_size(path: Path, manifest: Manifest, settings: Settings) -> None:
    """Refuse a model that no request could be served within the limits: a view wider than
    ``DBF_MAX_VIEW_DIM``, or so many classes and views that one sample's answer passes
    ``DBF_MAX_ANSWER_VALUES``."""
    for view in manifest.views:
        if view.dim > settings.max_view_dim:
            # An absent view is sent to its head as zeros: rows x dim of them, per request.
            raise ModelLoadError(
                f"{path}: view {view.name!r} has dim {view.dim}; at most {settings.max_view_dim} "
                "are served (DBF_MAX_VIEW_DIM)"
            )
    k, v = len(manifest.classes), len(manifest.views)
    if answer_values(k, v) > settings.max_answer_values:
        raise ModelLoadError(
            f"{path}: {k} classes and {v} views make {answer_values(k, v)} numbers in one sample's answer; "
            f"at most {settings.max_answer_values} are answered (DBF_MAX_ANSWER_VALUES)"
        )


def _check_stop(stop: threading.Event | None) -> None:
    if stop is not None and stop.is_set():
        raise ModelLoadError("load given up")


def _calibration(path: Path, manifest: Manifest) -> ModelCalibration | None:
    if manifest.calibration is None:
        return None
    try:
        return manifest.calibration.applied()
    except ValueError as error:  # the calibration package's own checks (the manifest's cannot see them all)
        raise ModelLoadError(f"{path}: invalid calibration section: {error}") from error


def _options(settings: Settings) -> onnxruntime.SessionOptions:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = settings.session_threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # idle threads must not burn CPU
    # A head's tensors stored outside its file would be read from the working directory, where no checksum
    # covers them: looked for where nothing can be (nothing is below a device file), they are refused.
    options.add_session_config_entry("session.model_external_initializers_file_folder_path", NO_FOLDER)
    return options


NO_FOLDER = "/dev/null/external-data"


def _session(file: Path, content: bytes, settings: Settings, provider: str) -> onnxruntime.InferenceSession:
    providers = [(CUDA, _cuda_options(settings)), CPU] if provider == CUDA else [CPU]
    try:
        return onnxruntime.InferenceSession(content, _options(settings), providers=providers)
    except Exception as error:  # onnxruntime raises its own exception types for unloadable graphs
        if NO_FOLDER in str(error):
            raise ModelLoadError(
                f"{file}: keeps tensors in another file (ONNX external data), which the manifest's checksum "
                "does not cover: a head is one self-contained file"
            ) from None
        raise ModelLoadError(f"{file}: onnxruntime cannot load it: {error}") from error


def _cuda_options(settings: Settings) -> dict[str, str]:
    """The CUDA provider's options: TF32 in MatMul only where ``DBF_CUDA_TF32`` asks for it (onnxruntime
    turns it on by default)."""
    return {"use_tf32": "1" if settings.cuda_tf32 else "0"}


def _cuda_usable(probe: bytes, settings: Settings) -> bool:
    """Whether CUDA really runs a session, found out once: onnxruntime falls back to CPU silently when the
    CUDA or cuDNN libraries are missing, logging an error for every session that asked for CUDA."""
    if CUDA not in onnxruntime.get_available_providers():
        return False
    onnxruntime.set_default_logger_severity(4)  # the probe's fallback error is expected: keep it quiet
    try:
        # CUDA and cuDNN from pip's nvidia-* packages are on no library path: load them first when they are
        # there (a CUDA base image has them on its own path; then this finds nothing and says so on stdout).
        with contextlib.redirect_stdout(io.StringIO()):
            onnxruntime.preload_dlls(directory="")
        session = onnxruntime.InferenceSession(probe, providers=[(CUDA, _cuda_options(settings)), CPU])
        usable = session.get_providers()[0] == CUDA
    except Exception:
        usable = False
    finally:
        onnxruntime.set_default_logger_severity(2)
    log.info("CUDA execution provider %s", "in use" if usable else "unavailable: running on CPU")
    return usable


def _check_signature(session: onnxruntime.InferenceSession, file: Path, dim: int, classes: int) -> list[str]:
    """The head's outputs, ``evidence`` and, from heads exported with range checks, ``range_excess``."""
    inputs, outputs = session.get_inputs(), session.get_outputs()
    names = [o.name for o in outputs]
    if [i.name for i in inputs] != ["features"] or names not in HEAD_OUTPUTS:
        raise ModelLoadError(
            f"{file}: takes {[i.name for i in inputs]} and gives {names}; a head takes one input "
            f"'features' and gives the output 'evidence', and may give '{RANGE_EXCESS}' after it"
        )
    [inp], out = inputs, outputs[0]
    if inp.type != "tensor(float)" or len(inp.shape) != 2 or inp.shape[1] != dim:
        raise ModelLoadError(f"{file}: input is {inp.type} {inp.shape}, manifest says float32 (N, {dim})")
    if len(out.shape) != 2 or out.shape[1] != classes:
        raise ModelLoadError(f"{file}: output is {out.shape}, manifest says (N, {classes})")
    if len(outputs) > 1 and (outputs[1].type != "tensor(float)" or len(outputs[1].shape) != 1):
        raise ModelLoadError(
            f"{file}: {RANGE_EXCESS} is {outputs[1].type} {outputs[1].shape}, a head's is float32 (N,)"
        )
    return names


PROBE_SECONDS = 10.0
"""The longest a head may take on its probe batches at load, all together (onnxruntime's run is told to
terminate then): a head answers a few samples in milliseconds, and one that never returns would hold the
start, or a reload, for ever."""
PROBE_BATCHES = (2, 1, 3)
"""The probe's batch sizes: 2, then 1 (the commonest request) and 3. With 2 alone, a head that takes a
batch of 2 only (declared so, or reshaped inside) loaded, then failed every other request (500), and one
that gives a single row for other sizes had it broadcast to every sample of the batch (200)."""


def _check_probe(
    session: onnxruntime.InferenceSession, file: Path, dim: int, classes: int, outputs: list[str]
) -> None:
    """Run the head on batches of zeros, as an absent view is sent to it: a graph whose declared shapes
    say (N, K) but whose real output is narrower (broadcast silently) or wider (an error on every request),
    that takes no batch of one of :data:`PROBE_BATCHES`, that gives negative or non-finite evidence, or a
    range excess not one non-negative number per sample, is refused here, not served. The batches share
    the :data:`PROBE_SECONDS`: a timer's thread each cost a load as much as the runs themselves."""
    options = onnxruntime.RunOptions()
    options.log_severity_level = 4  # onnxruntime's own error line: the refusal below says it, and which file
    timer = threading.Timer(PROBE_SECONDS, setattr, (options, "terminate", True))
    timer.daemon = True
    timer.start()
    try:
        for n in PROBE_BATCHES:
            _check_probe_batch(session, file, np.zeros((n, dim), dtype=np.float32), classes, outputs, options)
        _check_rows_apart(session, file, dim, outputs, options)
    finally:
        timer.cancel()


def _check_rows_apart(
    session: onnxruntime.InferenceSession,
    file: Path,
    dim: int,
    outputs: list[str],
    options: onnxruntime.RunOptions,
) -> None:
    """Refuse a head whose answer for a sample depends on the other samples of its batch (a mean over the
    batch, a batch norm exported in training mode): requests are batched together, so one client's answer
    changed with another's features (label 0 alone, 13 beside another sample), answered 200. Rows of
    zeros, of ones and of a ramp, run together and each alone, must agree (to float32's rounding across
    batch sizes); what the head gives for them is not judged, only that it is the same."""
    rows = np.stack([np.zeros(dim), np.ones(dim), np.linspace(-1, 1, dim)]).astype(np.float32)
    try:
        together = session.run(outputs, {"features": rows}, options)
        alone = [session.run(outputs, {"features": row[None]}, options) for row in rows]
    except Exception:  # onnxruntime raises its own types; a head that fails on such features is the runtime's
        if options.terminate:
            raise ModelLoadError(
                f"{file}: a probe batch did not finish within {PROBE_SECONDS:g} s: a graph that loops, or "
                "computes far more than a head does"
            ) from None
        return
    for i, answers in enumerate(alone):
        for name, batched, single in zip(outputs, together, answers, strict=True):
            with np.errstate(invalid="ignore", over="ignore"):
                same = np.allclose(
                    np.asarray(batched[i], np.float64),
                    np.asarray(single[0], np.float64),
                    rtol=1e-3,
                    atol=1e-6,
                    equal_nan=True,
                )
            if not same:
                raise ModelLoadError(
                    f"{file}: gives sample {i} of a probe batch of 3 another {name} than alone "
                    f"({np.ravel(batched[i])[:4].tolist()} against {np.ravel(single[0])[:4].tolist()}): a "
                    "head's answer for a sample must not depend on the other samples of its batch (a mean "
                    "or a batch norm over the batch axis; export in eval mode)"
                )


def _check_probe_batch(
    session: onnxruntime.InferenceSession,
    file: Path,
    probe: np.ndarray,
    classes: int,
    outputs: list[str],
    options: onnxruntime.RunOptions,
) -> None:
    n = len(probe)
    samples = f"{n} sample{'s' if n > 1 else ''}"
    try:
        evidence, *excess = session.run(outputs, {"features": probe}, options)
    except Exception as error:  # onnxruntime raises its own exception types
        if options.terminate:
            raise ModelLoadError(
                f"{file}: a probe batch of {samples} of zeros did not finish within {PROBE_SECONDS:g} s: a "
                "graph that loops, or computes far more than a head does"
            ) from None
        raise ModelLoadError(f"{file}: fails on a probe batch of {samples} of zeros: {error}") from error
    if not isinstance(evidence, np.ndarray) or evidence.dtype.kind not in "biuf":
        # Strings (or objects) pass the declared shape check, then fail every comparison below (a 500 at
        # reload, and a watcher that stops for good): refused here, naming the file.
        kind = getattr(evidence, "dtype", type(evidence).__name__)
        raise ModelLoadError(f"{file}: gives evidence of type {kind}; a head's is numbers (float32)")
    if evidence.shape != (n, classes):
        raise ModelLoadError(
            f"{file}: gives evidence of shape {evidence.shape} for {samples}; manifest says ({n}, {classes})"
        )
    with np.errstate(over="ignore"):
        # As the runtime fuses it: float64 evidence of 1e300 passed here, then overflowed every request (400,
        # blaming the request's features).
        evidence = evidence.astype(np.float32)
    if not np.isfinite(evidence).all() or (evidence < 0).any():
        raise ModelLoadError(
            f"{file}: gives negative or non-finite evidence for features of zeros (an absent view's): "
            f"{evidence[0, :8].tolist()}{' ...' if classes > 8 else ''}"
        )
    with np.errstate(over="ignore"):
        totals = evidence.sum(-1)
    if not np.isfinite(totals).all():
        # Fused, a strength of inf: beliefs, uncertainty and probabilities of 0 for every request.
        raise ModelLoadError(
            f"{file}: gives evidence for features of zeros whose sum is past float32's range: "
            f"{evidence[0, :8].tolist()}{' ...' if classes > 8 else ''}"
        )
    if excess and (excess[0].shape != (n,) or not (excess[0] >= 0).all()):
        raise ModelLoadError(
            f"{file}: gives {RANGE_EXCESS} of shape {excess[0].shape} for {samples} of zeros, starting "
            f"{excess[0].ravel()[:4].tolist()}; a head's is one non-negative number per sample"
        )
