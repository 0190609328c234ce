"""The ecosystem's gRPC clients, each driven in a process of its own (:func:`client_process`):
``tritonclient.grpc`` (sync and aio) and kserve's ``InferenceGRPCClient`` register different files of the same
proto package (``inference``) in protobuf's default pool, so they cannot be imported into one process (nor
into the test process, which imports kserve's REST client elsewhere). Each function here imports its client
itself, calls it, and returns plain values: arrays, or ``{"error": (status code name, message)}``.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any

import numpy as np

Features = dict[str, np.ndarray]


@contextmanager
def client_process() -> Iterator[ProcessPoolExecutor]:
    """A child process to run this module's functions in (``executor.submit(f, ...).result()``)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as executor:
        yield executor


# --- tritonclient.grpc ------------------------------------------------------------------------------------


def triton_call(address: str, method: str, *args: Any, headers: dict | None = None, **kwargs: Any) -> Any:
    """``InferenceServerClient(address).<method>(*args, **kwargs)``: its answer (as JSON for metadata)."""
    import tritonclient.grpc as triton
    from tritonclient.utils import InferenceServerException

    client = triton.InferenceServerClient(address)
    try:
        return getattr(client, method)(*args, headers=headers, **kwargs)
    except InferenceServerException as error:
        return {"error": (_code_name(error.status()), error.message())}
    finally:
        client.close()


def triton_infer(
    address: str,
    model: str,
    features: Features,
    *,
    headers: dict | None = None,
    outputs: list[str] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """One inference by tritonclient.grpc's sync client (raw inputs, as it sends them): the outputs by name
    and the response's parameters and ids, or the error."""
    import tritonclient.grpc as triton
    from tritonclient.utils import InferenceServerException

    client = triton.InferenceServerClient(address)
    try:
        requested = None if outputs is None else [triton.InferRequestedOutput(name) for name in outputs]
        answer = client.infer(
            model, _triton_inputs(triton, features), outputs=requested, headers=headers, **options
        )
    except InferenceServerException as error:
        return {"error": (_code_name(error.status()), error.message())}
    finally:
        client.close()
    return _triton_answer(answer)


def triton_aio_infer_many(address: str, model: str, batches: list[Features], **options: Any) -> list[dict]:
    """Every batch at once, concurrently, by tritonclient.grpc.aio's client on one channel."""
    import tritonclient.grpc as triton
    import tritonclient.grpc.aio as triton_aio

    async def infer_all() -> list[dict]:
        client = triton_aio.InferenceServerClient(address)
        try:
            calls = [client.infer(model, _triton_inputs(triton, batch), **options) for batch in batches]
            return [_triton_answer(answer) for answer in await asyncio.gather(*calls)]
        finally:
            await client.close()

    return asyncio.run(infer_all())


def _triton_inputs(triton: Any, features: Features) -> list:
    inputs = []
    for name, array in features.items():
        tensor = triton.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def _triton_answer(answer: Any) -> dict[str, Any]:
    response = answer.get_response()
    parameters = {key: getattr(p, p.WhichOneof("parameter_choice")) for key, p in response.parameters.items()}
    return {
        "outputs": {output.name: answer.as_numpy(output.name) for output in response.outputs},
        "parameters": parameters,
        "model": (response.model_name, response.model_version),
        "id": response.id,
    }


def _code_name(status: str | None) -> str:
    """tritonclient's status ``StatusCode.NOT_FOUND`` -> ``NOT_FOUND``."""
    return str(status).removeprefix("StatusCode.")


# --- kserve's InferenceGRPCClient -------------------------------------------------------------------------


def kserve_calls(address: str, model: str, features: Features, **parameters: Any) -> dict[str, Any]:
    """Readiness, metadata (kserve's client has no method for it: its stub) and one inference with raw and
    one with typed input tensors, by kserve's client: the answers, or the error of each."""
    import grpc
    from kserve import InferenceGRPCClient, InferInput, InferRequest
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb

    async def calls() -> dict[str, Any]:
        client = InferenceGRPCClient(address, timeout=30)
        done: dict[str, Any] = {}
        try:
            done["live"] = await client.is_server_live()
            done["ready"] = await client.is_server_ready()
            done["model_ready"] = await client.is_model_ready(model)
            metadata = await client._client_stub.ModelMetadata(pb.ModelMetadataRequest(name=model))
            done["metadata"] = (metadata.name, list(metadata.versions), [i.name for i in metadata.inputs])
            for kind, binary in (("raw", True), ("typed", False)):
                inputs = []
                for name, array in features.items():
                    tensor = InferInput(name, list(array.shape), "FP32")
                    tensor.set_data_from_numpy(array, binary_data=binary)
                    inputs.append(tensor)
                request = InferRequest(model, inputs, request_id=f"{kind}-1", parameters=parameters)
                try:
                    response = await client.infer(request)
                except grpc.aio.AioRpcError as error:
                    done[kind] = {"error": (error.code().name, error.details())}
                    continue
                done[kind] = {
                    "outputs": {output.name: output.as_numpy() for output in response.outputs},
                    "id": response.id,
                }
            try:
                await client.is_model_ready("no-such-model")
                done["missing"] = None
            except grpc.aio.AioRpcError as error:
                done["missing"] = (error.code().name, error.details())
        finally:
            await client.close()
        return done

    return asyncio.run(calls())
