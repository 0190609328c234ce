"""The Open Inference Protocol (KServe v2) for heavy users: ``POST /v2/models/{name}/infer`` with tensors
as JSON or, with the binary tensor data extension, as raw little-endian bytes after a JSON header.

Inputs: one FP32 tensor ``[N, dim]`` per view, named after it; a view left out is missing from every sample.
Request ``parameters``: ``method`` and ``lambda``. Outputs (all unless ``outputs`` names some):

==============  ========  ===========  ===============================================================
name            datatype  shape        meaning
==============  ========  ===========  ===============================================================
label           INT64     [N]          predicted class index
probability     FP32      [N, K]       projected probability of the fused opinion
belief          FP32      [N, K]       fused belief masses
uncertainty     FP32      [N]          fused uncertainty mass
conflict        FP32      [N, V, V]    degree of conflict between views (0 where a view is missing)
discount        FP32      [N, V]       DBF discount per view (1 where a view is missing)
high_conflict   BOOL      [N]          the calibrated flag
blamed_view     INT64     [N]          index of the view most to blame where flagged, else -1
==============  ========  ===========  ===============================================================

A binary request carries the header ``Inference-Header-Content-Length: <bytes of the JSON part>``; each
binary input has ``"parameters": {"binary_data_size": <bytes>}`` and its bytes follow in input order.
Outputs come back binary when asked (``"parameters": {"binary_data": true}`` per output, or
``"binary_data_output": true`` for all) or when the request itself was binary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from fusion import METHODS
from service.errors import InvalidInput, PayloadTooLarge
from service.parsing import Batch
from service.repository import LoadedModel
from service.runtime import Result

HEADER_LENGTH = "inference-header-content-length"
OUTPUTS = (
    "label",
    "probability",
    "belief",
    "uncertainty",
    "conflict",
    "discount",
    "high_conflict",
    "blamed_view",
)
_DATATYPES = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64", np.dtype(np.bool_): "BOOL"}


class _Tensor(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    datatype: str
    shape: list[int]
    parameters: dict[str, Any] = {}
    data: Any = None


class _Requested(msgspec.Struct):
    name: str
    parameters: dict[str, Any] = {}


class _Request(msgspec.Struct, forbid_unknown_fields=True):
    inputs: list[_Tensor]
    id: str | None = None
    parameters: dict[str, Any] = {}
    outputs: list[_Requested] | None = None


_DECODER = msgspec.json.Decoder(_Request)


@dataclass(frozen=True)
class Decoded:
    """A decoded request: the batch, and how to answer (its id, the outputs asked for, which in binary)."""

    batch: Batch
    id: str | None
    outputs: list[str]
    binary_outputs: set[str]


def metadata(model: LoadedModel) -> dict[str, Any]:
    """``GET /v2/models/{name}``: the tensors this model takes and gives."""
    k, v = len(model.manifest.classes), len(model.manifest.views)
    shapes = {"label": [-1], "probability": [-1, k], "belief": [-1, k], "uncertainty": [-1]}
    shapes |= {"conflict": [-1, v, v], "discount": [-1, v], "high_conflict": [-1], "blamed_view": [-1]}
    types = {"label": "INT64", "high_conflict": "BOOL", "blamed_view": "INT64"}
    return {
        "name": model.name,
        "versions": [],
        "platform": "dbf-serve",
        "inputs": [
            {"name": view.name, "datatype": "FP32", "shape": [-1, view.dim]} for view in model.manifest.views
        ],
        "outputs": [{"name": o, "datatype": types.get(o, "FP32"), "shape": shapes[o]} for o in OUTPUTS],
        "parameters": {
            "views": [view.name for view in model.manifest.views],
            "classes": model.manifest.classes,
        },
    }


def decode(body: bytes, header_length: str | None, model: LoadedModel, *, max_samples: int) -> Decoded:
    """A v2 request (JSON, or JSON header plus binary tensors) -> the batch, with errors naming the input."""
    if header_length is None:
        header, binary = body, b""
    else:
        if not header_length.isdigit() or int(header_length) > len(body):
            raise InvalidInput(
                f"Inference-Header-Content-Length {header_length!r} does not fit a {len(body)}-byte body"
            )
        header, binary = body[: int(header_length)], body[int(header_length) :]
    try:
        request = _DECODER.decode(header)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as error:
        raise InvalidInput(f"not an inference request: {error}") from None
    method, lam = _fusion(request.parameters, model)
    views, index = model.manifest.views, model.view_index
    arrays: dict[str, np.ndarray] = {}
    offset, n = 0, None
    for i, tensor in enumerate(request.inputs):
        where = f"inputs[{i}] ({tensor.name})"
        if tensor.name not in index:
            raise InvalidInput(f"{where}: unknown input; this model takes {list(index)}")
        if tensor.name in arrays:
            raise InvalidInput(f"{where}: given twice")
        dim = views[index[tensor.name]].dim
        if tensor.datatype != "FP32":
            raise InvalidInput(f"{where}: datatype must be FP32, got {tensor.datatype!r}")
        if len(tensor.shape) != 2 or tensor.shape[1] != dim or tensor.shape[0] < 1:
            raise InvalidInput(f"{where}: shape must be [N, {dim}] with N >= 1, got {tensor.shape}")
        rows = tensor.shape[0]
        if rows > max_samples:
            raise PayloadTooLarge(f"{rows} samples in one request; at most {max_samples} are accepted")
        if n is not None and rows != n:
            raise InvalidInput(f"{where}: {rows} rows where the inputs before have {n}")
        n = rows
        size = tensor.parameters.get("binary_data_size")
        if size is not None:
            if type(size) is not int or size != rows * dim * 4:
                raise InvalidInput(
                    f"{where}: binary_data_size must be {rows * dim * 4} bytes for {tensor.shape} FP32"
                )
            if offset + size > len(binary):
                raise InvalidInput(
                    f"{where}: binary data ends after {len(binary) - offset} of its {size} bytes"
                )
            array = np.frombuffer(binary, dtype="<f4", count=rows * dim, offset=offset).reshape(rows, dim)
            offset += size
        else:
            if tensor.data is None:
                raise InvalidInput(f"{where}: no data and no binary_data_size")
            malformed = InvalidInput(
                f"{where}: data must be {rows * dim} numbers, flat or nested as the shape"
            )
            if not _numbers_only(tensor.data):
                raise malformed
            try:
                array = np.asarray(tensor.data, dtype=np.float64)
            except (ValueError, OverflowError):  # ragged; an integer beyond float64
                raise malformed from None
            if array.size != rows * dim:
                raise malformed
            with np.errstate(over="ignore"):
                array = array.astype(np.float32).reshape(rows, dim)
        if not np.isfinite(array).all():
            row = int(np.argwhere(~np.isfinite(array))[0][0])
            raise InvalidInput(f"{where}: row {row} has a value that is not a finite float32")
        arrays[tensor.name] = array
    if offset != len(binary):
        raise InvalidInput(f"{len(binary) - offset} bytes of binary data after the last binary input")
    if n is None:
        raise InvalidInput(f"no inputs: send at least one of {list(index)}")
    features = {view.name: arrays.get(view.name, np.zeros((n, view.dim), np.float32)) for view in views}
    present = np.zeros((n, len(views)), dtype=bool)
    for name in arrays:
        present[:, index[name]] = True
    requested = [o.name for o in request.outputs] if request.outputs else list(OUTPUTS)
    unknown = sorted(set(requested) - set(OUTPUTS))
    if unknown:
        raise InvalidInput(f"unknown output(s) {unknown}; this model gives {list(OUTPUTS)}")
    everything_binary = header_length is not None or request.parameters.get("binary_data_output") is True
    binary_outputs = {o.name for o in request.outputs or [] if o.parameters.get("binary_data") is True} | (
        set(requested) if everything_binary else set()
    )
    return Decoded(Batch(features, present, method, lam), request.id, requested, binary_outputs)


def encode(model: LoadedModel, decoded: Decoded, result: Result) -> tuple[bytes, dict[str, str]]:
    """The v2 response body and its headers (binary outputs follow the JSON header in output order)."""
    arrays = {
        "label": result.label.astype(np.int64),
        "probability": result.probability.astype(np.float32),
        "belief": result.belief.astype(np.float32),
        "uncertainty": result.uncertainty.astype(np.float32),
        "conflict": result.conflict.astype(np.float32),
        "discount": result.discount.astype(np.float32),
        "high_conflict": result.high_conflict.astype(np.bool_),
        "blamed_view": np.where(result.high_conflict, result.blamed_view, -1).astype(np.int64),
    }
    outputs, blobs = [], []
    for name in decoded.outputs:
        array = arrays[name]
        tensor: dict[str, Any] = {
            "name": name,
            "datatype": _DATATYPES[array.dtype],
            "shape": list(array.shape),
        }
        if name in decoded.binary_outputs:
            blob = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
            tensor["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            tensor["data"] = array.ravel().tolist()
        outputs.append(tensor)
    answer: dict[str, Any] = {
        "model_name": model.name,
        "outputs": outputs,
        "parameters": {"method": result.method, "lambda": result.lam},
    }
    if decoded.id is not None:
        answer["id"] = decoded.id
    header = msgspec.json.encode(answer)
    if not blobs:
        return header, {"content-type": "application/json"}
    return header + b"".join(blobs), {
        "content-type": "application/octet-stream",
        HEADER_LENGTH: str(len(header)),
    }


def encode_request(
    features: dict[str, np.ndarray], *, method: str | None = None, lam: float | None = None
) -> tuple[bytes, dict[str, str]]:
    """A binary v2 request (body and headers) for ``features`` {view: (N, dim)}: what a client sends."""
    inputs, blobs = [], []
    for name, array in features.items():
        blob = np.ascontiguousarray(array, dtype="<f4").tobytes()
        inputs.append(
            {
                "name": name,
                "datatype": "FP32",
                "shape": list(array.shape),
                "parameters": {"binary_data_size": len(blob)},
            }
        )
        blobs.append(blob)
    parameters = {k: v for k, v in (("method", method), ("lambda", lam)) if v is not None}
    header = msgspec.json.encode({"inputs": inputs, "parameters": parameters})
    headers = {"content-type": "application/octet-stream", HEADER_LENGTH: str(len(header))}
    return header + b"".join(blobs), headers


def decode_response(body: bytes, headers: dict[str, str]) -> dict[str, np.ndarray]:
    """A v2 response -> {output name: array}: what a client reads."""
    length = headers.get(HEADER_LENGTH)
    header, binary = (body, b"") if length is None else (body[: int(length)], body[int(length) :])
    answer = msgspec.json.decode(header)
    dtypes = {"FP32": "<f4", "INT64": "<i8", "BOOL": "?"}
    out, offset = {}, 0
    for tensor in answer["outputs"]:
        dtype = np.dtype(dtypes[tensor["datatype"]])
        size = tensor.get("parameters", {}).get("binary_data_size")
        if size is None:
            out[tensor["name"]] = np.asarray(tensor["data"], dtype=dtype).reshape(tensor["shape"])
        else:
            out[tensor["name"]] = np.frombuffer(
                binary, dtype=dtype, count=size // dtype.itemsize, offset=offset
            )
            out[tensor["name"]] = out[tensor["name"]].reshape(tensor["shape"])
            offset += size
    return out


def _fusion(parameters: dict[str, Any], model: LoadedModel) -> tuple[str, float]:
    method = parameters.get("method", model.manifest.fusion.method)
    if method not in METHODS:
        raise InvalidInput(
            f"parameters.method: unknown method {method!r}; expected one of {', '.join(METHODS)}"
        )
    lam = parameters.get("lambda", model.manifest.fusion.lam)
    if type(lam) not in (int, float) or not math.isfinite(lam) or lam <= 0:
        raise InvalidInput(f"parameters.lambda must be a positive finite number, got {lam!r}")
    return method, float(lam)


def _numbers_only(data: Any) -> bool:
    """True if ``data`` holds ints and floats only (numpy would also take booleans and numeric strings)."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif type(item) not in (int, float):
            return False
    return True
