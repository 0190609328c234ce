"""Write trained heads as a checksummed model repository entry: one ONNX file per view and manifest.json.

Each head's graph takes the view's raw features, float32 ``(N, dim)`` with a dynamic batch axis, and returns
evidence float32 ``(N, K)``: the min-max scaling fitted on the training split and the activation are inside
the graph, so the service feeds features exactly as the data stores them. A second output, ``range_excess``
float32 ``(N,)``, says how far each sample lies outside the training range (:func:`head_to_onnx`), for the
service to refuse certainty about features unlike any it was trained on. The graphs are built node by node
with ``onnx.helper`` (linear layers, ReLU, the capped exponential): small, readable, and the same bytes for
the same weights. Nothing is written unless every head matches its torch original (max relative error 1e-4)
under onnxruntime, and the entry appears all at once (:func:`write_model`). :mod:`training.fit` trains what
is written here.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import math
import os
import platform
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from pathlib import Path

import numpy as np
import torch
from torch import nn

from manifest import Manifest, ViewEntry
from training.heads import EVIDENCE_CAP, EvidentialHeads, ViewHead
from training.protocol import MinMaxScaler
from training.registry import DATASETS, DatasetSpec

PARITY_TOLERANCE = 1e-4
_OPSET = 17
_IR_VERSION = 8  # readable by every onnxruntime release since 1.10
CARD_FIGURES = ("reliability.png", "coverage.png", "uncertainty.png", "training.png")
"""The model card's figures (:mod:`training.card` draws these alone): a model directory holds no other PNG."""

# What a model directory holds beside its manifest's ONNX files: the manifest, and the card and its figures.
# By name, not a pattern: a folder of pictures with a manifest.json put in it is not a model to replace.
_MODEL_FILES = ("manifest.json", "card.md", *CARD_FIGURES)
STAGED_MANIFEST_PREFIX = ".manifest.json."
"""A new manifest written beside the old one before it is renamed over it (``view-agreement --write``): one
left by a killed run is part of the model directory, replaced with it."""

# The longest name a file system takes for one file or directory where it does not say: that of Linux' and
# macOS' own file systems.
_NAME_MAX = 255


class ParityError(RuntimeError):
    """An exported graph does not reproduce its torch head."""


class ModelDirError(ValueError):
    """A path a model may not be written to: it is not a model directory, the data is in or around it, or the
    model cannot be written there (a name too long, no permission, a full disk)."""


def _scaling_and_range_excess(minimum: np.ndarray, maximum: np.ndarray) -> tuple[dict[str, np.ndarray], list]:
    """The constants and nodes of a head's graph that scale ``features`` (to ``h0``) and give ``range_excess``
    (see :func:`head_to_onnx`)."""
    from onnx import helper

    span = np.asarray(maximum, np.float64) - np.asarray(minimum, np.float64)
    # The scaler maps constant features to 0: multiply by 0 there instead of dividing by 0.
    inverse_span = np.where(span > 0, 1.0 / np.where(span > 0, span, 1.0), 0.0).astype(np.float32)
    varying = max(int(np.count_nonzero(span > 0)), 1)
    constants = {
        "minimum": np.asarray(minimum, np.float32),
        "inverse_span": inverse_span,
        "zero": np.array(0.0, np.float32),
        "one": np.array(1.0, np.float32),
        "inverse_varying": np.array(1.0 / varying, np.float32),
    }
    nodes = [
        helper.make_node("Sub", ["features", "minimum"], ["shifted"]),
        helper.make_node("Mul", ["shifted", "inverse_span"], ["h0"]),
        # The signed distance outside [0, 1] (squared next, so its sign does not matter): two passes.
        helper.make_node("Clip", ["h0", "zero", "one"], ["inside"]),
        helper.make_node("Sub", ["h0", "inside"], ["outside"]),
        helper.make_node("ReduceSumSquare", ["outside"], ["outside_squared"], axes=[1], keepdims=0),
        helper.make_node("Mul", ["outside_squared", "inverse_varying"], ["outside_mean_square"]),
        helper.make_node("Sqrt", ["outside_mean_square"], ["range_excess"]),
    ]
    return constants, nodes


def range_excess_session(minimum: np.ndarray, maximum: np.ndarray):
    """An onnxruntime session (CPU) whose ``range_excess`` of raw float32 ``features`` is, to the bit, that of
    a head exported with the training range ``minimum``, ``maximum`` (:func:`head_to_onnx`): the float32
    arithmetic the service compares with the manifest's ``out_of_range`` threshold."""
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper

    constants, nodes = _scaling_and_range_excess(minimum, maximum)
    graph = helper.make_graph(
        nodes,
        "range_excess",
        [
            helper.make_tensor_value_info(
                "features", TensorProto.FLOAT, ["batch", int(constants["minimum"].size)]
            )
        ],
        [helper.make_tensor_value_info("range_excess", TensorProto.FLOAT, ["batch"])],
        initializer=[numpy_helper.from_array(value, name) for name, value in constants.items()],
    )
    model = _checked_model(graph)
    return onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def head_to_onnx(head: ViewHead, minimum: np.ndarray, maximum: np.ndarray, *, view: str):
    """The ONNX graph of ``head`` with min-max scaling (``minimum``, ``maximum`` per feature) in front.

    Input ``features`` float32 ``(batch, dim)``; outputs ``evidence`` float32 ``(batch, K)`` and
    ``range_excess`` float32 ``(batch,)``: the root mean square, over the features that vary in training, of
    each feature's distance outside its training range in units of that range's span (0 for a sample inside
    the range; constant features never count). The root mean square rather than the largest distance: in
    wide views of heavy-tailed features (CUB's image embedding) a clean test sample can have one feature
    farther out than any feature of the docs' nonsense example (docs/api/v1.md), several of whose features
    lie below anything seen; the mean over the features tells the two apart (docs/operations/limits.md has
    the figures).
    """
    from onnx import TensorProto, helper, numpy_helper

    constants, nodes = _scaling_and_range_excess(minimum, maximum)
    inverse_span = constants["inverse_span"]
    linears = [module for module in head.net if isinstance(module, nn.Linear)]
    current = "h0"
    for i, linear in enumerate(linears):
        constants[f"weight{i}"] = linear.weight.detach().numpy().T.astype(np.float32)
        constants[f"bias{i}"] = linear.bias.detach().numpy().astype(np.float32)
        nodes.append(helper.make_node("MatMul", [current, f"weight{i}"], [f"product{i}"]))
        nodes.append(helper.make_node("Add", [f"product{i}", f"bias{i}"], [f"linear{i}"]))
        current = f"linear{i}"
        if i < len(linears) - 1:
            nodes.append(helper.make_node("Relu", [current], [f"hidden{i}"]))
            current = f"hidden{i}"
    if head.activation == "exp":
        # C / (1 + C e^-x) = exp(log C - softplus(log C - x)), as training.heads.capped_exp
        constants["log_cap"] = np.array(math.log(EVIDENCE_CAP), np.float32)
        nodes += [
            helper.make_node("Sub", ["log_cap", current], ["headroom"]),
            helper.make_node("Softplus", ["headroom"], ["overshoot"]),
            helper.make_node("Sub", ["log_cap", "overshoot"], ["log_evidence"]),
            helper.make_node("Exp", ["log_evidence"], ["evidence"]),
        ]
    else:
        nodes.append(helper.make_node("Softplus", [current], ["evidence"]))
    dim = int(inverse_span.shape[0])
    classes = int(linears[-1].out_features)
    graph = helper.make_graph(
        nodes,
        f"{view}_evidential_head",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", dim])],
        [
            helper.make_tensor_value_info("evidence", TensorProto.FLOAT, ["batch", classes]),
            helper.make_tensor_value_info("range_excess", TensorProto.FLOAT, ["batch"]),
        ],
        initializer=[numpy_helper.from_array(value, name) for name, value in constants.items()],
    )
    return _checked_model(graph)


def _checked_model(graph):
    """``graph`` as a model of the opset and IR version every head has, checked in full."""
    import onnx
    from onnx import helper

    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", _OPSET)],
        producer_name="dbf-serve",
        ir_version=_IR_VERSION,
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def check_parity(
    model_bytes: bytes, head: ViewHead, raw: np.ndarray, scaled: np.ndarray, *, view: str
) -> float:
    """Largest relative error of the ONNX graph on ``raw`` against the torch head on ``scaled``.

    Raises :class:`ParityError` above :data:`PARITY_TOLERANCE`.
    """
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    session = onnxruntime.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
    exported = session.run(["evidence"], {"features": np.ascontiguousarray(raw, dtype=np.float32)})[0]
    with torch.inference_mode():
        expected = head(torch.as_tensor(scaled)).numpy()
    error = float(np.max(np.abs(exported - expected) / (np.abs(expected) + 1e-6)))
    if not error <= PARITY_TOLERANCE:
        raise ParityError(
            f"view {view}: ONNX evidence differs from torch by {error:.2e} (> {PARITY_TOLERANCE})"
        )
    return error


def check_model_dir(out_dir: str | os.PathLike[str], *, data: str | os.PathLike[str] | None = None) -> None:
    """Refuse ``out_dir`` as a model's directory unless writing it there loses nothing but an older model.

    ``out_dir`` may be absent (made, with its parents), or a model directory, which is replaced: a real
    directory (not a symbolic link) with a ``manifest.json`` that is a model's, holding nothing but what a
    model directory holds (the manifest's ONNX files, the model card and its figures). Anything else is
    refused: a file, a link, any other directory (a folder of notes, the model repository), and, with
    ``data`` (what the model is fitted on), the data itself, a directory holding it, or a place inside the
    data's directory. :func:`write_model` checks again just before it replaces ``out_dir``.

    Raises
    ------
    ModelDirError
        Saying what ``out_dir`` is and what to do instead.
    """
    out = Path(out_dir)
    _check_name_lengths(out)  # first: the system's answer to any question about such a path is an error
    if data is not None:
        _check_apart_from_data(out, Path(data))
    if out.is_symlink():
        raise ModelDirError(
            f"{out}: a symbolic link; a model is written only to a real directory: name it, not the link"
        )
    ancestor = next(path for path in (out, *out.parents) if os.path.lexists(path))
    _check_writable(out, ancestor)
    if ancestor != out:  # absent: made, with its parents
        return
    if not out.is_dir():
        raise ModelDirError(f"{out}: a file, not a model directory; name a new directory for the model")
    manifest = _model_manifest(out)
    if manifest is None:
        raise ModelDirError(
            f"{out}: not a model directory (no manifest.json of a model), so it is not replaced: name a new "
            "directory for the model, or move this one away first"
        )
    heads = {view.file for view in manifest.views}
    for entry in sorted(out.iterdir()):
        staged = entry.name.startswith(STAGED_MANIFEST_PREFIX)
        known = entry.name in heads or entry.name in _MODEL_FILES or staged
        if not known or entry.is_symlink() or not entry.is_file():
            raise ModelDirError(
                f"{out}: holds {entry.name}, which a model directory does not, so it is not replaced: move "
                f"{entry.name} out, or name a new directory for the model"
            )


def _check_name_lengths(out: Path) -> None:
    """Refuse an ``out`` with a name longer than a file system takes (asked of the system, it is an error)."""
    existing = next((path for path in out.parents if os.path.isdir(path)), Path("."))
    try:
        longest = os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):  # not POSIX, or the file system does not say
        longest = _NAME_MAX
    for part in out.parts:
        size = len(os.fsencode(part))
        if size > longest:
            raise ModelDirError(
                f"{out}: {part[:40]}... is too long for a directory name ({size} bytes, where the file "
                f"system takes {longest}); name the model more briefly"
            )


def _check_writable(out: Path, ancestor: Path) -> None:
    """Refuse, before training, an ``out`` that could not be made or replaced: its nearest existing
    ``ancestor`` is a file, or where it goes cannot be written (no permission, a read-only file system)."""
    if ancestor != out and not ancestor.is_dir():
        raise ModelDirError(f"{ancestor}: a file, so {out} cannot be made there")
    where = ancestor if ancestor != out else out.parent
    if not os.access(where, os.W_OK | os.X_OK):
        raise ModelDirError(f"{where}: cannot be written (no permission, or a read-only file system)")


def _check_apart_from_data(out: Path, data: Path) -> None:
    """Refuse ``out`` where it is the data, holds it, or lies inside the data's directory."""
    out_path, data_path = out.resolve(), data.resolve()
    if out_path == data_path:
        raise ModelDirError(f"{out}: is the data ({data}); name a new directory for the model")
    if data_path.is_relative_to(out_path):
        raise ModelDirError(f"{out}: holds the data ({data}); name a new directory for the model")
    if data_path.is_dir() and out_path.is_relative_to(data_path):
        raise ModelDirError(
            f"{out}: inside the data directory {data}; name a directory outside it for the model"
        )


def _model_manifest(directory: Path) -> Manifest | None:
    """The manifest of the model in ``directory``; None where it has none that is a model's."""
    path = directory / "manifest.json"
    if path.is_symlink() or not path.is_file():
        return None
    try:
        return Manifest.model_validate_json(path.read_bytes())
    except (OSError, ValueError):
        return None


def write_model(
    out_dir: str | os.PathLike[str],
    *,
    heads: EvidentialHeads,
    scaler: MinMaxScaler,
    parity: Mapping[str, tuple[np.ndarray, np.ndarray]],
    manifest: Callable[[list[ViewEntry]], Manifest],
    extras: Callable[[Path, Manifest], object] | None = None,
    data: str | os.PathLike[str] | None = None,
) -> Manifest:
    """Write ``heads`` as the model directory ``out_dir``: an ONNX graph per view, ``manifest.json``, extras.

    Everything goes into a staging directory beside ``out_dir``, renamed into place once written and
    verified: a failure leaves ``out_dir`` (an existing model or nothing) untouched. Only a model directory is
    replaced, and never the data (:func:`check_model_dir`, checked first and again just before the rename).

    Parameters
    ----------
    heads : EvidentialHeads
        One head per view, in the order of ``scaler``'s views.
    scaler : MinMaxScaler
        The scaling each graph applies to raw features first.
    parity : mapping of view name to (raw, scaled) arrays, each (n, d_v)
        Rows to check each graph on (:func:`check_parity`): raw features and the scaled ones the head saw.
    manifest : callable
        Makes the manifest from the written views' entries.
    extras : callable, optional
        Writes more files (a model card) into the staging directory, given it and the manifest.
    data : path, optional
        What the model was fitted on: never written into or over.
    """
    out = Path(out_dir)
    check_model_dir(out, data=data)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        # A short prefix: the name beside out_dir must fit where out_dir's own name just does.
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name[:32]}.", dir=out.parent))
    except OSError as error:
        raise _unwritten(out, error) from error
    try:
        entries = []
        for v, head in zip(scaler.minimum, heads.heads, strict=True):
            graph = head_to_onnx(head, scaler.minimum[v], scaler.maximum[v], view=v).SerializeToString()
            raw, scaled = parity[v]
            check_parity(graph, head, raw, scaled, view=v)
            (staging / f"{v}.onnx").write_bytes(graph)
            entries.append(
                ViewEntry(
                    name=v,
                    dim=int(scaler.minimum[v].shape[0]),
                    file=f"{v}.onnx",
                    sha256=hashlib.sha256(graph).hexdigest(),
                )
            )
        written = manifest(entries)
        (staging / "manifest.json").write_text(written.json_text())
        if extras is not None:
            extras(staging, written)
        staging.chmod(0o755)  # mkdtemp's 0700 would make the model private to its writer
        _flush_to_disk(staging)
        check_model_dir(out, data=data)  # what is at out_dir now, not when writing began
        _swap_in(staging, out)
        with contextlib.suppress(OSError):  # the swap itself; done already, so no longer the write's failure
            _flush_to_disk(out.parent, files=False)
    except OSError as error:
        raise _unwritten(out, error) from error
    finally:  # the unfinished model, or once swapped in, the old one
        shutil.rmtree(staging, ignore_errors=True)
    return written


def _unwritten(out: Path, error: OSError) -> ModelDirError:
    """What a failed write (a full disk, a name too long) says: why, and that ``out`` is as it was."""
    reason = error.strerror or str(error)
    return ModelDirError(f"{out}: the model could not be written ({reason}); {out} is as it was")


def _flush_to_disk(directory: Path, *, files: bool = True) -> None:
    """``fsync`` ``directory``'s regular files (with ``files``), then the directory itself: a rename is
    written to disk apart from the data it names, and after a power loss a model swapped in before its files
    reached the disk could be empty files, which the service refuses, and with them its start."""
    if files:
        for entry in directory.iterdir():
            if entry.is_file() and not entry.is_symlink():
                with entry.open("r+b") as written:  # Windows syncs only a handle open for writing
                    os.fsync(written.fileno())
    if os.name == "nt":  # no directory can be opened there, and NTFS journals its renames
        return
    descriptor = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(descriptor)
    except OSError as error:
        if error.errno not in (errno.EINVAL, errno.ENOTSUP):  # a file system that syncs no directory
            raise
    finally:
        os.close(descriptor)


def _swap_in(staging: Path, out: Path) -> None:
    """Put the directory ``staging`` at ``out``; an older model at ``out`` ends up at ``staging``.

    Where the system can (Linux), one atomic exchange: ``out`` is the old model or the new one at every
    instant, whatever interrupts the process. Elsewhere two renames, the old model put back if the second
    fails or is interrupted.
    """
    if not out.exists():
        staging.rename(out)
        return
    if _exchange(staging, out):
        return
    retired = staging.with_name(staging.name + ".retired")
    out.rename(retired)
    try:
        staging.rename(out)
    except BaseException:
        retired.rename(out)
        raise
    retired.rename(staging)


_RENAME_EXCHANGE = 2  # <linux/fs.h>
_AT_FDCWD = -100


def _exchange(first: Path, second: Path) -> bool:
    """Swap two directories' names at once (Linux' ``renameat2`` with ``RENAME_EXCHANGE``); False where the
    system or its file system cannot, having changed nothing."""
    if sys.platform != "linux":
        return False
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # a C library without it (glibc before 2.28, musl before 1.2.5)
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    done = renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE)
    if done == 0:
        return True
    code = ctypes.get_errno()
    # A kernel or file system without it (EXDEV: an overlay's, which then moves directories by copying).
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(code, os.strerror(code), str(second))


def provenance() -> dict[str, str]:
    """Versions of the code and libraries that make a model, for its manifest."""
    versions = {"python": platform.python_version()}
    for package in ("dbf-serve", "torch", "numpy", "onnx"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "absent"
    # The parity check ran on whichever onnxruntime build is installed (pyproject's cpu or gpu extra).
    runtimes = {}
    for package in ("onnxruntime", "onnxruntime-gpu"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            runtimes[package] = metadata.version(package)
    return {**versions, **(runtimes or {"onnxruntime": "absent"})}


def exported_evidence(model_dir: str | os.PathLike[str], views: Mapping[str, np.ndarray]) -> np.ndarray:
    """Evidence ``(N, V, K)`` of an exported model on raw features (a reader for tests and checks)."""
    return _exported_output(model_dir, views, "evidence")


def exported_range_excess(model_dir: str | os.PathLike[str], views: Mapping[str, np.ndarray]) -> np.ndarray:
    """``range_excess`` ``(N, V)`` of an exported model on raw features (see :func:`head_to_onnx`)."""
    return _exported_output(model_dir, views, "range_excess")


def training_ranges(model_dir: str | os.PathLike[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each view's training range as its head's graph holds it: ``(minimum, span)`` per feature, span 0
    for a feature constant in training (see :func:`head_to_onnx`)."""
    import onnx
    from onnx import numpy_helper

    model_dir = Path(model_dir)
    manifest = Manifest.model_validate_json((model_dir / "manifest.json").read_text())
    ranges = {}
    for entry in manifest.views:
        graph = onnx.load(str(model_dir / entry.file)).graph
        constants = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}
        inverse = constants["inverse_span"].astype(np.float64)
        span = np.divide(1.0, inverse, where=inverse > 0, out=np.zeros_like(inverse))
        ranges[entry.name] = (constants["minimum"], span)
    return ranges


def benchmark_model(model_dir: str | os.PathLike[str]) -> tuple[Manifest, DatasetSpec, int]:
    """An exported benchmark model's manifest, its dataset's spec and the seed of its split: what measuring
    it again on that dataset's splits needs (``python -m training calibration`` and ``view-agreement``).

    Raises
    ------
    ValueError
        Naming the model: its manifest is not one, or the model is not of a benchmark dataset as exported (a
        user's fit of a directory called like one has other views), or it has no seed of its split.
    OSError
        Where the manifest cannot be read.
    """
    import pydantic

    model_dir = Path(model_dir)
    path = model_dir / "manifest.json"
    try:
        manifest = Manifest.model_validate_json(path.read_text())
    except pydantic.ValidationError as error:
        first = error.errors()[0]
        where = ".".join(map(str, first["loc"])) or "the document"
        raise ValueError(f"{path}: not a model's manifest ({where}: {first['msg']})") from None
    spec = DATASETS.get(manifest.dataset)
    if spec is None:
        raise ValueError(
            f"{model_dir}: its dataset {manifest.dataset!r} is no benchmark dataset ({', '.join(DATASETS)}): "
            "only models exported from one can be measured on its splits"
        )
    views = tuple(view.name for view in manifest.views)
    dims = tuple(view.dim for view in manifest.views)
    if views != spec.view_names or (spec.view_dims is not None and dims != spec.view_dims):
        raise ValueError(
            f"{model_dir}: its views {', '.join(views)} are not the {spec.name} benchmark's "
            f"({', '.join(spec.view_names)}, of dims {spec.view_dims}): only models exported from it can be "
            "measured on its splits"
        )
    seed = manifest.training.get("seed")
    if type(seed) is not int or seed < 0:  # bool is no seed either
        raise ValueError(f"{model_dir}: the manifest's training section has no seed of its split ({seed!r})")
    return manifest, spec, seed


def _exported_output(
    model_dir: str | os.PathLike[str], views: Mapping[str, np.ndarray], output: str
) -> np.ndarray:
    """Each view's head's ``output`` on raw features, stacked on axis 1 in the manifest's view order.

    A head whose bytes are not the manifest's SHA-256 is refused (ValueError naming it), as the service
    refuses it: a figure measured on other heads than the served ones would be another model's."""
    import onnxruntime

    model_dir = Path(model_dir)
    manifest = Manifest.model_validate_json((model_dir / "manifest.json").read_text())
    out = []
    for entry in manifest.views:
        graph = (model_dir / entry.file).read_bytes()
        if hashlib.sha256(graph).hexdigest() != entry.sha256:
            raise ValueError(f"{model_dir / entry.file}: not the head its manifest names (checksum mismatch)")
        session = onnxruntime.InferenceSession(graph, providers=["CPUExecutionProvider"])
        out.append(session.run([output], {"features": np.asarray(views[entry.name], np.float32)})[0])
    return np.stack(out, axis=1)


__all__: Sequence[str] = [
    "CARD_FIGURES",
    "ModelDirError",
    "ParityError",
    "benchmark_model",
    "check_model_dir",
    "check_parity",
    "exported_evidence",
    "training_ranges",
    "exported_range_excess",
    "head_to_onnx",
    "provenance",
    "range_excess_session",
    "write_model",
]
