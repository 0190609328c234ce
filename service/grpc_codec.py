"""The Open Inference Protocol over gRPC (KServe's ``grpc_predict_v2.proto``, as Triton and MLServer serve
it): its messages to and from the core. The protocol's grammar, checks and error messages are REST v2's
(:mod:`service.v2`): a request is read off its message into v2's request and checked there, once.

Inputs: one FP32 tensor ``[N, dim]`` per view, named after it, its data in ``raw_input_contents`` (little-
endian bytes, one entry per input in order: what tritonclient sends) or in its ``contents.fp32_contents``
(typed), one way for all inputs. Request ``parameters``: ``method`` (string), ``lambda`` and ``coverage``
(double, as tritonclient sends a float, or int64), as REST's. Outputs come back in ``raw_output_contents``
when the request was raw, typed in each output's ``contents`` when it was typed (``binary_data_output``
chooses otherwise), all of them one way; the response's parameters say the method, lambda and coverage.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from google.protobuf.message import DecodeError

from service import v2
from service.errors import InvalidInput
from service.inference import InferenceRequest, ModelSignature, Result
from service.outputs import TENSORS
from service.proto import grpc_predict_v2_pb2 as pb
from service.schemas import InferInput, InferRequest, InferRequestedOutput

T = TypeVar("T")

PROTOCOL = "grpc"  # the protocol label of its requests' metrics
SERVICE = "inference.GRPCInferenceService"
# Where a datatype's values go in InferTensorContents.
_CONTENTS = {"FP32": "fp32_contents", "INT64": "int64_contents", "BOOL": "bool_contents"}
# A message up to this size is parsed whatever it holds (the cost is bounded by its size: at most a few
# thousand map entries); a bigger one has its fields counted first.
COUNTED_BYTES = 64 * 1024
MOST_FIELDS = 4096
"""The most fields a ModelInferRequest may have, its inputs' and outputs' counted in: a request of a model
of 64 views, every output asked for, has a few hundred."""
# The fields whose messages' fields count too: a map's entries and a repeated message's elements are
# what parsing costs in proportion to (entries of distinct keys more than in proportion).
_COUNTED_WITHIN = frozenset(
    pb.ModelInferRequest.DESCRIPTOR.fields_by_name[name].number for name in ("inputs", "outputs")
)


@dataclass(frozen=True, slots=True)
class Message:
    """A received ModelInferRequest, and its size on the wire (which the core's choices go by)."""

    request: pb.ModelInferRequest
    size: int

    def __len__(self) -> int:
        return self.size


def parse(body: bytes) -> Message:
    """A ModelInferRequest's bytes -> its message (:func:`read`); a big one has its fields counted first
    (:func:`check_fields`)."""
    if len(body) > COUNTED_BYTES:
        check_fields(body)
    return Message(read(pb.ModelInferRequest, body), len(body))


def check_fields(body: bytes) -> None:
    """INVALID_ARGUMENT (:class:`InvalidInput`) for a ModelInferRequest of more than :data:`MOST_FIELDS`
    fields, counted on the wire before protobuf parses it: each field of the request, and of each of its
    inputs and outputs (a map entry is a field; a tensor's contents, a packed array, one).

    protobuf's parser takes time and memory in proportion to the fields, not the bytes: a 21 MB request of
    1.5 million ``parameters`` entries of distinct keys took 31 s and 140 MB to parse. Counting stops at
    the limit, or at anything it cannot read (the parser then says what is wrong).
    """
    count = _fields_in(body, 0, len(body), _COUNTED_WITHIN)
    if count > MOST_FIELDS:
        raise InvalidInput(
            f"not a ModelInferRequest a client sends: more than {MOST_FIELDS} fields (parameters, inputs, "
            "outputs and theirs)"
        )


def _fields_in(data: bytes, start: int, end: int, counted_within: frozenset[int]) -> int:
    """How many fields the message in ``data[start:end]`` has (the messages of fields ``counted_within``
    adding theirs), up to just past :data:`MOST_FIELDS`: wire types varint (0), 64-bit (1), length-
    delimited (2) and 32-bit (5); a group, or bytes that end early, stops the count there."""
    count, i = 0, start
    while i < end and count <= MOST_FIELDS:
        tag, i = _varint(data, i)
        kind = tag & 7
        if kind == 0:
            _, i = _varint(data, i)
        elif kind == 1:
            i += 8
        elif kind == 5:
            i += 4
        elif kind == 2:
            length, i = _varint(data, i)
            if tag >> 3 in counted_within and i + length <= end:
                count += _fields_in(data, i, i + length, frozenset())
            i += length
        else:  # a group (deprecated), or not protobuf at all
            break
        count += 1
    return count


def _varint(data: bytes, i: int) -> tuple[int, int]:
    """The varint at ``data[i]`` and where the next field starts; past the end (``len(data) + 1``) where
    the bytes end before it does."""
    value = shift = 0
    while i < len(data):
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i
        shift += 7
    return 0, len(data) + 1


def read(kind: type[T], body: bytes) -> T:
    """A request message of ``kind`` from its bytes (INVALID_ARGUMENT, via :class:`InvalidInput`, if they
    are none): read here rather than by gRPC, whose failure would be the server's (INTERNAL)."""
    try:
        return kind.FromString(body)
    except DecodeError as error:
        raise InvalidInput(f"not a {kind.DESCRIPTOR.name} message: {error}") from None


def accept(headers: Mapping[str, str]) -> None:
    """Nothing is refused before the message is read."""


def body_bytes(body: Message, headers: Mapping[str, str]) -> tuple[int, int]:
    """Raw tensors are binary; typed ones (each value a Python number on its way to an array) cost as text."""
    return (0, len(body)) if body.request.raw_input_contents else (len(body), 0)


def binary_answer(context: v2.Context) -> bool:
    """Raw outputs (all of them, when any was asked for raw), else typed ones, each a Python number."""
    return bool(context.binary)


def decode(
    body: Message, headers: Mapping[str, str], signature: ModelSignature, *, max_samples: int
) -> tuple[InferenceRequest, v2.Context]:
    """A ModelInferRequest -> the request, checked as v2's (the same messages)."""
    message = body.request
    raw = message.raw_input_contents
    if raw and len(raw) != len(message.inputs):
        typed = next((i for i, tensor in enumerate(message.inputs) if tensor.HasField("contents")), None)
        if typed is not None:  # some inputs raw, some typed: not a count to fix
            raise InvalidInput(
                f"inputs[{typed}] ({message.inputs[typed].name}): contents beside raw_input_contents for "
                "other inputs; send the tensors one way: all raw (one entry per input, in input order) or "
                "all typed"
            )
        raise InvalidInput(
            f"raw_input_contents has {len(raw)} entries for {len(message.inputs)} inputs: send one per "
            "input, in input order"
        )
    inputs, flat, unfit = [], {}, {}
    # Beyond one input more than the model has views, v2's checks refuse one already (unknown or repeated):
    # the rest need not be read. So for the outputs.
    for i, tensor in enumerate(message.inputs[: len(signature.views) + 1]):
        where = f"inputs[{i}] ({tensor.name})"
        parameters = _values(tensor.parameters)
        if tensor.datatype == "FP32":  # another is refused by v2's checks, whatever its data
            try:
                flat[i] = _fp32_values(tensor, raw[i] if raw else None, where, i, parameters)
            except InvalidInput as error:  # said by v2's checks where REST's data would be: after the shape
                flat[i], unfit[i] = np.empty(0, np.float32), error.message
        else:
            flat[i] = np.empty(0, np.float32)
        # REST's binary extension (kserve's client sends it beside raw contents): no meaning over gRPC,
        # where the contents say how the data comes.
        parameters.pop("binary_data_size", None)
        inputs.append(InferInput(tensor.name, tensor.datatype, list(tensor.shape), parameters))
    outputs = [
        InferRequestedOutput(o.name, _values(o.parameters)) for o in message.outputs[: len(TENSORS) + 1]
    ]
    request = InferRequest(
        inputs=inputs, id=message.id or None, parameters=_values(message.parameters), outputs=outputs or None
    )
    return v2.tensors_request(
        request, flat, b"", signature, max_samples, binary_request=bool(raw), unfit=unfit
    )


def encode(context: v2.Context, result: Result) -> bytes:
    """The ModelInferResponse's bytes: every output raw when any was asked for as binary, else typed."""
    answer = pb.ModelInferResponse(
        model_name=context.signature.name, model_version=context.signature.version, id=context.id or ""
    )
    answer.parameters["method"].string_param = result.method
    answer.parameters["lambda"].double_param = result.lam
    if result.coverage is not None:
        answer.parameters["coverage"].double_param = result.coverage
    raw = bool(context.binary)
    for name in context.outputs:
        tensor = TENSORS[name].tensor
        array = tensor.take(result)
        output = answer.outputs.add(name=name, datatype=tensor.datatype, shape=array.shape)
        if raw:
            answer.raw_output_contents.append(np.ascontiguousarray(array).tobytes())
        else:
            getattr(output.contents, _CONTENTS[tensor.datatype]).extend(array.ravel().tolist())
    return answer.SerializeToString()


def locate(error: InvalidInput, context: v2.Context) -> InvalidInput:
    """As v2's: the input holding the sample's view, and the row."""
    return v2.locate(error, context)


def metadata(signature: ModelSignature) -> pb.ModelMetadataResponse:
    """ModelMetadata: REST's ``GET /v2/models/{name}`` (:func:`service.v2.metadata`) but its parameters,
    which the message has no field for."""
    described = v2.metadata(signature)
    return pb.ModelMetadataResponse(
        name=described["name"],
        versions=described["versions"],
        platform=described["platform"],
        inputs=[pb.ModelMetadataResponse.TensorMetadata(**tensor) for tensor in described["inputs"]],
        outputs=[pb.ModelMetadataResponse.TensorMetadata(**tensor) for tensor in described["outputs"]],
    )


def _fp32_values(
    tensor: pb.ModelInferRequest.InferInputTensor, raw: bytes | None, where: str, i: int, parameters: dict
) -> np.ndarray:
    """An FP32 input's values: ``raw`` (its ``raw_input_contents`` entry, read in place), else its typed
    ``fp32_contents`` and no values of another type beside them; their count checked against its shape
    where that has two dimensions (v2's checks refuse any other)."""
    typed = tensor.HasField("contents")
    if raw is not None and typed:
        raise InvalidInput(f"{where}: both contents and raw_input_contents; send the tensors one way")
    shape = list(tensor.shape)
    takes = shape[0] * shape[1] if len(shape) == 2 else None
    if raw is not None:
        if len(raw) % 4:
            raise InvalidInput(
                f"{where}: raw_input_contents[{i}] is {len(raw)} bytes, not a whole number of FP32 values"
            )
        if takes is not None and len(raw) != 4 * takes:
            raise InvalidInput(
                f"{where}: raw_input_contents[{i}] is {len(raw)} bytes; {shape} FP32 takes {4 * takes}"
            )
        return np.frombuffer(raw, dtype="<f4")
    if not typed:
        v2.refuse_shared_memory(parameters, where, "send its data in the message")
    contents = tensor.contents
    others = [field.name for field, _ in contents.ListFields() if field.name != "fp32_contents"]
    if others:
        raise InvalidInput(
            f"{where}: {' and '.join(others)} for an FP32 input: send its values in fp32_contents (or "
            "raw_input_contents)"
        )
    values = contents.fp32_contents
    if takes is not None and len(values) != takes:
        if not len(values):
            raise InvalidInput(f"{where}: no fp32_contents and no raw_input_contents")
        raise InvalidInput(f"{where}: fp32_contents has {len(values)} values; {shape} FP32 takes {takes}")
    return np.array(values, dtype=np.float32)


def _values(parameters: Mapping[str, pb.InferParameter]) -> dict[str, Any]:
    """InferParameters as the JSON values REST's parameters would be (a string, a number, a bool)."""
    values = {}
    for key, parameter in parameters.items():
        kind = parameter.WhichOneof("parameter_choice")
        values[key] = None if kind is None else getattr(parameter, kind)
    return values
