"""The Open Inference Protocol (KServe v2, as Triton speaks it) codec, with the binary tensor data extension:
``POST /v2/models/{name}[/versions/{version}]/infer`` with tensors as JSON or as raw little-endian bytes after
a JSON header. The server's side (:func:`decode`, :func:`encode`, :func:`metadata`) and a client's
(:func:`encode_request`, :func:`decode_response`) live together; numpy and msgspec only, so clients can use
it without the server's dependencies.

Inputs: one FP32 tensor ``[N, dim]`` per view, named after it; a view left out is missing from every sample.
Request ``parameters``: ``method`` and ``lambda`` (the model's defaults otherwise), ``coverage`` (of the
prediction sets; the model's default otherwise) and ``binary_data_output``. Outputs: the tensors of
:data:`service.outputs.TENSORS` that the model gives (``GET /v2/models/{name}`` lists them with their
shapes; a model without calibration gives no ``confidence`` or ``prediction_set``), all unless ``outputs``
names some.

A binary request carries the header ``Inference-Header-Content-Length: <bytes of the JSON part>``; each
binary input has ``"parameters": {"binary_data_size": <bytes>}`` and its bytes follow in input order. An
output comes back binary when it asks (``"parameters": {"binary_data": true}``), else as the request's
``binary_data_output`` says, else binary exactly when the request was. The protocol's objects are
extensible: fields and parameters that are not ours are ignored; ours are checked. A key given twice in an
object is refused (as v1 does), never read as the last of the two.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from service.errors import InvalidInput
from service.inference import (
    JSON_BESIDE_SAMPLES,
    InferenceRequest,
    JSONConstant,
    ModelSignature,
    Result,
    check_json_containers,
    check_json_text,
    request_options,
    too_many_samples,
)
from service.lengths import MAX_DIGITS, declared_length
from service.outputs import DTYPES, TENSORS, Output, json_array, slices
from service.schemas import InferRequest

PROTOCOL = "rest"  # the protocol label of its requests' metrics
HEADER_LENGTH = "inference-header-content-length"
BINARY_MEDIA_TYPE = "application/octet-stream"
JSON_MEDIA_TYPE = "application/json"
_DECODER = msgspec.json.Decoder(InferRequest)
_FLAT = msgspec.json.Decoder(list[float])  # the usual JSON tensor: flat, as tritonclient and kserve send it
_NESTED = msgspec.json.Decoder(list[list[float]])  # nested as its [N, dim] shape
# UTF-8's, before a JSON text: RFC 8259 lets a parser ignore it, and v1's does (simdjson)
_BYTE_ORDER_MARK = b"\xef\xbb\xbf"
# msgspec's words for a number beyond float64, and where: `$[3]`, `$[0][2]`
_OUT_OF_RANGE = re.compile(r"Number out of range - at `\$(.*)`")
# msgspec's words for a null where a number is: orjson (kserve's REST client) writes NaN as null
_NULL = re.compile(r"Expected `float`, got `null` - at `\$(.*)`")
# From this size a JSON body is read by simdjson (_read_fast): below it, its setup and the Python around it
# cost more than the Python floats it saves (one HandWritten sample, 13 KB, is below it).
_FAST_READ_BYTES = 16 * 1024


@dataclass(frozen=True)
class Context:
    """How to answer a decoded request: its id, the outputs asked for (which of them binary), and its
    inputs' names in request order (to say where an error is)."""

    signature: ModelSignature
    id: str | None
    outputs: tuple[str, ...]
    binary: frozenset[str]
    inputs: tuple[str, ...]


def accept(headers: Mapping[str, str]) -> None:
    """Nothing is refused before the body is read: JSON and binary requests alike."""


def body_bytes(body: bytes, headers: Mapping[str, str]) -> tuple[int, int]:
    """A JSON body is text; a binary one, its JSON header and its tensors."""
    try:
        length = header_length(headers.get(HEADER_LENGTH), len(body))
    except InvalidInput:  # decoding words it
        length = None
    return (len(body), 0) if length is None else (length, len(body) - length)


def binary_answer(context: Context) -> bool:
    """Every output asked for binary (a JSON one costs as text)."""
    return len(context.binary) == len(context.outputs)


def decode(
    body: bytes, headers: Mapping[str, str], signature: ModelSignature, *, max_samples: int
) -> tuple[InferenceRequest, Context]:
    """A v2 request (JSON, or a JSON header plus binary tensors) -> the request; errors name the input."""
    length = header_length(headers.get(HEADER_LENGTH), len(body))
    header, binary = (body, b"") if length is None else (body[:length], body[length:])
    header = header.removeprefix(_BYTE_ORDER_MARK)
    brackets = check_json_text(header, signature, max_samples=max_samples)  # before any parser reads it
    # A JSON body, tensors and all: simdjson reads its data straight into doubles (flat: {input: values}).
    # A binary request's header, a small body, or anything the fast reader declines: msgspec, which words
    # any error.
    fast = _read_fast(header, brackets) if length is None and len(header) >= _FAST_READ_BYTES else None
    if fast is None:
        check_json_containers(header, brackets, signature, max_samples=max_samples)  # msgspec makes objects
    request, flat = fast if fast is not None else (_request(header, signature, length), {})
    return tensors_request(request, flat, binary, signature, max_samples, binary_request=length is not None)


def tensors_request(
    request: InferRequest,
    flat: dict[int, np.ndarray],
    binary: bytes,
    signature: ModelSignature,
    max_samples: int,
    *,
    binary_request: bool,
    unfit: Mapping[int, str] | None = None,
) -> tuple[InferenceRequest, Context]:
    """An Open Inference Protocol request, read off its wire (REST's JSON and binary tensors here, gRPC's
    messages in :mod:`service.grpc_codec`), checked against the model: its inputs' data are ``flat``'s
    arrays (by input position; numbers already read), else binary (``binary_data_size`` bytes of
    ``binary`` each, in input order), else their JSON ``data``. ``unfit``: why some of ``flat``'s do not
    fit their inputs' shapes, in their wire's words, said where their data are checked (after the
    inputs' names, datatypes and shapes, whose errors come first whatever the data)."""
    method, lam, coverage = _options(request.parameters, signature)
    views, index = signature.views, signature.view_index
    with np.errstate(over="ignore"):  # values beyond float32 become infinity, refused as not finite
        arrays, absent, n = _arrays(request, flat, binary, signature, max_samples, unfit or {})
    if n is None:
        raise InvalidInput(f"no inputs: send at least one of {list(index)}")
    features = {view.name: arrays.get(view.name, np.empty((0, view.dim), np.float32)) for view in views}
    present = np.zeros((n, len(views)), dtype=bool)
    for name in arrays:
        present[:, index[name]] = ~absent[name] if name in absent else True
    if absent and not present.any(axis=1).all():
        row = int(np.flatnonzero(~present.any(axis=1))[0])
        raise InvalidInput(f"row {row} has no view: every input's row is NaN there; send at least one")
    outputs, binary_outputs = _outputs(request, signature, binary_request=binary_request)
    context = Context(signature, request.id, outputs, binary_outputs, tuple(t.name for t in request.inputs))
    return InferenceRequest(features, present, method, lam, coverage), context


def encode(context: Context, result: Result) -> tuple[bytes, dict[str, str]]:
    """The v2 response body and its headers (binary outputs follow the JSON header in output order)."""
    import orjson  # the server's encoder (numpy arrays straight to JSON); clients never encode answers

    outputs, blobs = [], []
    ranges = slices(context.signature, len(result))
    for name in context.outputs:
        array = TENSORS[name].tensor.take(result)
        tensor: dict[str, Any] = {"name": name, "datatype": TENSORS[name].tensor.datatype}
        tensor["shape"] = list(array.shape)
        if name in context.binary:
            blob = array.tobytes()
            tensor["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        elif len(ranges) == 1:
            tensor["data"] = np.ascontiguousarray(array).ravel()
        else:  # flat, in slices of samples: orjson renders a numpy array in one call, holding the GIL
            parts = (np.ascontiguousarray(array[start:stop]).ravel() for start, stop in ranges)
            tensor["data"] = orjson.Fragment(
                json_array(orjson.dumps(part, option=orjson.OPT_SERIALIZE_NUMPY) for part in parts)
            )
        outputs.append(tensor)
    answer: dict[str, Any] = {
        "model_name": context.signature.name,
        "model_version": context.signature.version,
        "outputs": outputs,
        "parameters": {"method": result.method, "lambda": result.lam},
    }
    if result.coverage is not None:
        answer["parameters"]["coverage"] = result.coverage
    if context.id is not None:
        answer["id"] = context.id
    header = orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return header, {"content-type": JSON_MEDIA_TYPE}
    return header + b"".join(blobs), {"content-type": BINARY_MEDIA_TYPE, HEADER_LENGTH: str(len(header))}


def locate(error: InvalidInput, context: Context) -> InvalidInput:
    """A core error about one sample's view, worded in v2's grammar (the input holding it, and the row)."""
    name = context.signature.views[error.view].name
    return error.located(f"inputs[{context.inputs.index(name)}] ({name}): row {error.sample}")


def metadata(signature: ModelSignature) -> dict[str, Any]:
    """``GET /v2/models/{name}``: the tensors this model takes and gives."""
    k, v = len(signature.classes), len(signature.views)
    return {
        "name": signature.name,
        "versions": [signature.version],
        "platform": "dbf-serve",
        "inputs": [
            {"name": view.name, "datatype": "FP32", "shape": [-1, view.dim]} for view in signature.views
        ],
        "outputs": [
            {"name": name, "datatype": output.tensor.datatype, "shape": [-1, *output.tensor.shape(k, v)]}
            for name, output in _offered(signature).items()
        ],
        "parameters": {
            "views": signature.view_names,
            "classes": list(signature.classes),
            "methods": list(signature.methods),
            "method": signature.method,
            "lambda": signature.lam,
            "calibrated": signature.calibrated,
            **({"coverage": signature.default_coverage} if signature.calibrated else {}),
            **({"max_coverage": signature.max_coverage} if signature.calibrated else {}),
            **({"placement": signature.placement} if signature.placement is not None else {}),
        },
    }


def header_length(text: str | None, body_size: int) -> int | None:
    """``Inference-Header-Content-Length``: None if absent, else a length within the body, or a 400."""
    if text is None:
        return None
    text = text.strip(" \t")  # a field's value has no surrounding whitespace (RFC 9110 5.5)
    # Leading zeros too count: a header longer than any length we accept is refused as it is.
    length = declared_length(text) if len(text) <= MAX_DIGITS else None
    if length is None or length > body_size:
        shown = text if len(text) <= 40 else f"{text[:40]}... ({len(text)} characters)"
        raise InvalidInput(f"Inference-Header-Content-Length {shown!r} does not fit a {body_size}-byte body")
    return length


def _request(header: bytes, signature: ModelSignature, length: int | None) -> InferRequest:
    """The request in a JSON text (the body, or its first ``length`` bytes as its
    Inference-Header-Content-Length says), or a 400 that says what is wrong with it."""
    try:
        request = _DECODER.decode(header)
    except msgspec.DecodeError as error:
        if not header and length is None:
            raise InvalidInput("not an inference request: the body is empty") from None
        message = _constant_in(header, signature)
        framing = _framing(header, length, malformed=not isinstance(error, msgspec.ValidationError))
        message = message or f"not an inference request: {error}{framing}"
        raise InvalidInput(message) from None
    except (msgspec.ValidationError, UnicodeDecodeError, RecursionError) as error:
        raise InvalidInput(f"{_not_a_request(error).message}{_framing(header, length)}") from None
    from service import json_numbers  # the server's (simdjson); clients never decode requests

    # Each member of an object has its colon: a header with as many as the members msgspec kept repeats no
    # key (the common case, one count). Else (a repeat, a field not ours, a colon in a string) look.
    if json_numbers.colons(header) != _members(request):
        _refuse_repeated_keys(header)
    return request


def _framing(text: bytes, length: int | None, *, malformed: bool = True) -> str:
    """What to add to the error of a JSON text that does not parse where the body may not be framed as its
    client meant: binary tensors after a JSON header whose length the request must give (else the whole body
    is read as JSON), or a length given that is not the header's (the JSON cut short, or tensors' bytes
    read as JSON: a length counted in characters, not bytes, or one off), where the header is not JSON
    (``malformed``: a header that is JSON but not a request is framed right)."""
    if length is not None:
        if not malformed:
            return ""
        return (
            f"; Inference-Header-Content-Length says the JSON header is the body's first {length} bytes: "
            "it must be exactly the header's length in bytes, the binary tensors following it"
        )
    if b'"binary_data_size"' not in text:
        return ""
    return (
        "; a body of binary tensors needs the Inference-Header-Content-Length header: the JSON header's "
        "length in bytes"
    )


def _constant_in(header: bytes, signature: ModelSignature) -> str | None:
    """Where a JSON text that msgspec found malformed has ``NaN`` or ``Infinity`` (what Python's json writes
    for a float that is none: ``lambda=float("nan")``), with what to send instead: in an input's data, a
    request option (worded as every protocol words a bad one), or anywhere else; None if that is not what is
    wrong with it. Read by Python's parser, which takes them; the text's counts
    (:func:`check_json_containers`) have bounded what it makes."""
    if b"NaN" not in header and b"Infinity" not in header:
        return None
    try:
        document = json.loads(header, parse_constant=JSONConstant)
    except (ValueError, RecursionError):
        return None
    inputs = document.get("inputs") if isinstance(document, dict) else None
    for i, tensor in enumerate(inputs if isinstance(inputs, list) else ()):
        data = tensor.get("data") if isinstance(tensor, dict) else None
        found = next(((j, v) for j, v in enumerate(_leaves(data)) if isinstance(v, JSONConstant)), None)
        if found is not None:
            return (
                f"inputs[{i}] ({tensor.get('name')}): data[{found[0]}] is {found[1]!r}; a view a sample "
                "lacks goes as a row all NaN in binary data (or is left out of every sample)"
            )
    parameters = document.get("parameters") if isinstance(document, dict) else None
    if isinstance(parameters, dict) and any(
        isinstance(parameters.get(option), JSONConstant) for option in ("method", "lambda", "coverage")
    ):
        try:
            _options(parameters, signature)
        except InvalidInput as error:
            return error.message
    try:
        where = _constant_at(document, "")
    except RecursionError:
        return None
    return None if where is None else f"not an inference request: {where[0]} is {where[1]!r}"


def _constant_at(value: Any, where: str) -> tuple[str, JSONConstant] | None:
    """The first ``NaN`` or ``Infinity`` in a document Python's parser read, and where it is."""
    if isinstance(value, JSONConstant):
        return where or "the request", value
    if isinstance(value, dict):
        places = ((f"{where}.{key}" if where else key, item) for key, item in value.items())
    elif isinstance(value, list):
        places = ((f"{where}[{i}]", item) for i, item in enumerate(value))
    else:
        return None
    return next((found for place, item in places if (found := _constant_at(item, place))), None)


def _leaves(data: Any) -> Iterator[Any]:
    """The values of nested lists in row-major order (flat data's order)."""
    stack = [iter(data)] if isinstance(data, list) else []
    while stack:
        value = next(stack[-1], _leaves)
        if value is _leaves:
            stack.pop()
        elif isinstance(value, list):
            stack.append(iter(value))
        else:
            yield value


def _not_a_request(error: Exception) -> InvalidInput:
    reason = "nested too deeply" if isinstance(error, RecursionError) else error
    return InvalidInput(f"not an inference request: {reason}")


def _members(request: InferRequest) -> int:
    """How many members the objects of a request's JSON had, at least, from what msgspec kept of them: a
    repeated key kept once, fields not ours and objects inside parameters not counted."""
    count = 1 + (request.id is not None) + (request.outputs is not None) + _given(request.parameters)
    for tensor in request.inputs:
        count += 3 + (tensor.data is not msgspec.UNSET) + _given(tensor.parameters)
    for output in request.outputs or ():
        count += 1 + _given(output.parameters)
    return count


def _given(parameters: dict[str, Any]) -> int:
    """The members of a non-empty ``parameters`` object, and the one holding it."""
    return len(parameters) + 1 if parameters else 0


def _refuse_repeated_keys(header: bytes) -> None:
    """A 400 naming a key an object of the request repeats (msgspec would take the last one silently), as
    v1 refuses them: found in simdjson's document, or by Python's parser where simdjson cannot read the
    header (an integer beyond 64 bits, a key holding a NUL character)."""
    from service import json_numbers  # the server's (simdjson); clients never decode requests

    try:
        found = json_numbers.read(header, _repeated_key)
        if found is None:
            json.loads(header, object_pairs_hook=json_numbers.unique_keys, parse_int=float)
    except (ValueError, RecursionError) as error:
        raise _not_a_request(error) from None
    if found:
        raise InvalidInput(f"not an inference request: {found}")


def _repeated_key(document: Any) -> str:
    """Where an object of a request (simdjson's document, an object) repeats a key, at any depth but in its
    inputs' data (numbers, or refused); "" if none does. Walked in Python: past :data:`JSON_BESIDE_SAMPLES`
    values outside the inputs' data, which no request has, it stops and says so."""
    from service.json_numbers import Array

    left = [JSON_BESIDE_SAMPLES]
    found = _repeated_in(document, "", left, skip="inputs")
    inputs = document.get("inputs")
    for i, tensor in enumerate(inputs if type(inputs) is Array else ()):
        found = found or _repeated_in(tensor, f"inputs[{i}]", left, skip="data")
    return found


def _repeated_in(value: Any, where: str, left: list[int], skip: str | None = None) -> str:
    """Where ``value`` (simdjson's) or a value in it (but its member ``skip``) repeats a key: "" if none;
    ``left[0]``: how many values more may be visited."""
    from service.json_numbers import Array, Object, repeated_key

    left[0] -= 1
    if left[0] < 0:
        return f"more than {JSON_BESIDE_SAMPLES} values outside the inputs' data"
    if type(value) is Object:
        key = repeated_key(value)
        if key is not None:
            return f"duplicate key {key!r} in {where or 'the request'}"
        for key in value:  # (items() would convert the value skipped, a tensor's data, too)
            found = "" if key == skip else _repeated_in(value[key], f"{where}.{key}" if where else key, left)
            if found:
                return found
    elif type(value) is Array:
        for i, item in enumerate(value):
            found = _repeated_in(item, f"{where}[{i}]", left)
            if found:
                return found
    return ""


def _read_fast(body: bytes, brackets: int) -> tuple[InferRequest, dict[int, np.ndarray]] | None:
    """A JSON request read by simdjson: the request without its inputs' ``data``, and each input's data as
    float64 (msgspec's path skips over the data once, then makes a Python float of each number: twice the
    time). None for anything unusual (a repeated key, a ``[`` in a string, data not a flat list of numbers,
    a field of the wrong type), which msgspec's path then reads, or refuses in its words. ``brackets``: how
    many ``[`` the body has."""
    from service import json_numbers  # the server's (simdjson); clients never decode requests

    try:
        read = json_numbers.read(body, _plain_request)
        if read is None:
            return None
        plain, flat = read
        # As many brackets as lists read: no data held a nested list (whose numbers, flattened, could fit).
        if brackets != json_numbers.lists_in(plain) + len(flat):
            return None
    except RecursionError:  # nested deeper than Python recurses (simdjson reads 1024 levels)
        return None
    try:
        return msgspec.convert(plain, InferRequest), flat
    except msgspec.ValidationError:
        return None


def _plain_request(document: Any) -> tuple[dict[str, Any], dict[int, np.ndarray]] | None:
    """simdjson's document as Python values but for the inputs' data, read as arrays of numbers."""
    from service.json_numbers import Array, numbers, object_keys, plain

    keys = object_keys(document)
    if keys is None or "inputs" not in keys or type(document["inputs"]) is not Array:
        return None
    if _repeated_key(document):  # msgspec's path words it
        return None
    request = {key: plain(document[key]) for key in keys if key != "inputs"}
    request["inputs"], flat = [], {}
    for i, tensor in enumerate(document["inputs"]):
        fields = object_keys(tensor)
        if fields is None:
            return None
        request["inputs"].append({field: plain(tensor[field]) for field in fields if field != "data"})
        if "data" in fields:
            flat[i] = numbers(tensor["data"])
            if flat[i] is None:
                return None
    return request, flat


def _arrays(
    request: InferRequest,
    flat: dict[int, np.ndarray],
    binary: bytes,
    signature: ModelSignature,
    max_samples: int,
    unfit: Mapping[int, str],
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], int | None]:
    """Each input's float32 rows (from binary data, ``flat``'s numbers read by the fast reader or from
    gRPC's contents, or its JSON ``data``), checked against the model's views, with the rows all NaN left
    out; which rows those were, by input (only inputs that had any); and N (None: no inputs)."""
    views, index = signature.views, signature.view_index
    arrays: dict[str, np.ndarray] = {}
    absent: dict[str, np.ndarray] = {}  # per input with rows all NaN: which rows (the view missing there)
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
            raise too_many_samples(rows, max_samples)
        if n is not None and rows != n:
            raise InvalidInput(f"{where}: {rows} rows where the inputs before have {n}")
        n = rows
        if "binary_data_size" in tensor.parameters:  # null too: refused below, as no size
            size = tensor.parameters["binary_data_size"]
            if i in flat or tensor.data is not msgspec.UNSET:
                raise InvalidInput(f"{where}: both data and binary_data_size; send the tensor one way")
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
        elif i in flat:
            if i in unfit:
                raise InvalidInput(unfit[i])
            if flat[i].size != rows * dim:
                raise InvalidInput(_malformed(rows * dim, where))
            array = flat[i].astype(np.float32, copy=False).reshape(rows, dim)  # float64 read from JSON
        elif tensor.data is msgspec.UNSET:
            refuse_shared_memory(tensor.parameters, where, "send its data in the request")
            raise InvalidInput(f"{where}: no data and no binary_data_size")
        else:
            array = _json_data(tensor.data, rows, dim, where)
        if not np.isfinite(array).all():
            array, absent[tensor.name] = _without_missing_rows(array, where)
        arrays[tensor.name] = array
    if offset != len(binary):
        raise InvalidInput(f"{len(binary) - offset} bytes of binary data after the last binary input")
    return arrays, absent, n


def _without_missing_rows(array: np.ndarray, where: str) -> tuple[np.ndarray, np.ndarray]:
    """The rows of an input that are not all NaN, and which are (N,): a row of NaN marks the view missing
    from that sample, as in fit's data; any other value not a finite float32 is refused."""
    missing = np.isnan(array).all(axis=1)
    kept = array[~missing]
    if not np.isfinite(kept).all():
        row = int(np.flatnonzero(~missing)[np.argwhere(~np.isfinite(kept))[0][0]])
        raise InvalidInput(
            f"{where}: row {row} has a value that is not a finite float32 (a row all NaN marks the view "
            "missing from that sample)"
        )
    return kept, missing


def refuse_shared_memory(parameters: dict[str, Any], where: str, instead: str) -> None:
    """A 400 for a tensor in shared memory (Triton's extension, not served): an output's region ignored
    would leave its client reading what nothing wrote. (An input that has its data in the request too is
    read from there: that parameter is ignored, as any that is not ours.)"""
    if any(key.startswith("shared_memory_") for key in parameters):
        raise InvalidInput(f"{where}: the shared-memory extension is not supported; {instead}")


def _malformed(count: int, where: str, *errors: Exception) -> str:
    """Why a tensor's JSON ``data`` was refused: a number beyond float64, or a null, where msgspec found one
    (they were else said to be the wrong count of numbers), else not ``count`` numbers as the shape has
    them."""
    for error in errors:
        beyond = _OUT_OF_RANGE.match(str(error))
        if beyond:
            return f"{where}: data{beyond[1]} is not a finite float32 (a number beyond float64)"
        null = _NULL.match(str(error))
        if null:
            return (
                f"{where}: data{null[1]} is null, not a number (NaN as orjson, which kserve's client uses, "
                "writes it); a view a sample lacks goes as a row all NaN in binary data (or is left out of "
                "every sample)"
            )
    return f"{where}: data must be {count} numbers, flat or nested as the shape"


def _json_data(raw: msgspec.Raw, rows: int, dim: int, where: str) -> np.ndarray:
    """A JSON tensor's ``data``: ``rows * dim`` numbers, flat or nested as the shape (booleans, strings and
    numbers beyond float64 are refused, where numpy would convert them). Numbers beyond float32 become
    infinity: the caller ignores numpy's overflow warnings, and refuses them as not finite."""
    try:
        values: list = _FLAT.decode(raw)
    except msgspec.ValidationError as flat:
        try:
            nested = _NESTED.decode(raw)
        except (msgspec.ValidationError, RecursionError) as error:
            raise InvalidInput(_malformed(rows * dim, where, flat, error)) from None
        if len(nested) != rows or any(len(row) != dim for row in nested):
            raise InvalidInput(_malformed(rows * dim, where)) from None
        return np.array(nested, dtype=np.float32)
    except RecursionError:
        raise InvalidInput(_malformed(rows * dim, where)) from None
    if len(values) != rows * dim:
        raise InvalidInput(_malformed(rows * dim, where))
    # fromiter: faster than np.array on a flat list (no intermediate object array)
    return np.fromiter(values, np.float32, count=rows * dim).reshape(rows, dim)


def _offered(signature: ModelSignature) -> dict[str, Output]:
    """The output tensors this model gives (calibrated ones only if it has a calibration)."""
    return {name: o for name, o in TENSORS.items() if signature.calibrated or not o.calibrated}


def _options(parameters: dict[str, Any], signature: ModelSignature) -> tuple[str, float, float | None]:
    """The request's fusion (method, lambda) and coverage, checked by the core."""
    return request_options(parameters, signature, parameter_name)


def parameter_name(option: str) -> str:
    """A request option's place in the Open Inference Protocol (REST and gRPC): among the parameters."""
    return f"parameters.{option}"


def _outputs(
    request: InferRequest, signature: ModelSignature, *, binary_request: bool
) -> tuple[tuple[str, ...], frozenset[str]]:
    """The outputs asked for (all the model gives, if none are named) and those to send as binary."""
    default = request.parameters.get("binary_data_output", binary_request)
    if type(default) is not bool:
        raise InvalidInput(f"parameters.binary_data_output must be true or false, got {default!r}")
    offered = _offered(signature)
    if not request.outputs:
        return tuple(offered), frozenset(offered) if default else frozenset()
    names, binary = [], set()
    for i, output in enumerate(request.outputs):
        where = f"outputs[{i}] ({output.name})"
        if output.name not in offered:
            raise InvalidInput(f"{where}: unknown output; this model gives {list(offered)}")
        if output.name in names:
            raise InvalidInput(f"{where}: asked for twice")
        if "classification" in output.parameters:
            raise InvalidInput(f"{where}: the classification extension is not supported")
        refuse_shared_memory(output.parameters, where, "leave its region out: it comes back in the answer")
        wanted = output.parameters.get("binary_data", default)
        if type(wanted) is not bool:
            raise InvalidInput(f"{where}: parameters.binary_data must be true or false, got {wanted!r}")
        names.append(output.name)
        if wanted:
            binary.add(output.name)
    return tuple(names), frozenset(binary)


# --- the client's side -------------------------------------------------------------------------------


def encode_request(
    features: Mapping[str, np.ndarray],
    *,
    method: str | None = None,
    lam: float | None = None,
    binary_output: bool = True,
) -> tuple[bytes, dict[str, str]]:
    """A binary v2 request (body and headers) for ``features`` {view: (N, dim)}: what a client sends.

    ``binary_output``: answers as binary tensors (the compact way) or as JSON.
    """
    inputs, blobs = [], []
    for name, array in features.items():
        blob = np.ascontiguousarray(array, dtype="<f4").tobytes()
        inputs.append(
            {
                "name": name,
                "datatype": "FP32",
                "shape": list(np.shape(array)),
                "parameters": {"binary_data_size": len(blob)},
            }
        )
        blobs.append(blob)
    parameters: dict[str, Any] = {k: v for k, v in (("method", method), ("lambda", lam)) if v is not None}
    parameters["binary_data_output"] = binary_output
    header = msgspec.json.encode({"inputs": inputs, "parameters": parameters})
    headers = {"content-type": BINARY_MEDIA_TYPE, HEADER_LENGTH: str(len(header))}
    return header + b"".join(blobs), headers


def decode_response(body: bytes, headers: Mapping[str, str]) -> dict[str, np.ndarray]:
    """A v2 response -> {output name: array}: what a client reads."""
    lowered = {key.lower(): value for key, value in headers.items()}
    length = header_length(lowered.get(HEADER_LENGTH), len(body))
    header, binary = (body, b"") if length is None else (body[:length], body[length:])
    answer = msgspec.json.decode(header)
    out, offset = {}, 0
    for tensor in answer["outputs"]:
        dtype = DTYPES[tensor["datatype"]]
        size = tensor.get("parameters", {}).get("binary_data_size")
        if size is None:
            array = np.asarray(tensor["data"], dtype=dtype)
        else:
            array = np.frombuffer(binary, dtype=dtype, count=size // dtype.itemsize, offset=offset)
            offset += size
        out[tensor["name"]] = array.reshape(tensor["shape"])
    return out
