"""What a hostile client does with a request's headers, body and size, against the running service: every
header and number is parsed defensively (a 4xx, never a 500), slow bodies hold no predict slot, bodies'
memory is budgeted (a real memory cgroup of the pod's size where one can be made), and big answers are
rendered off the event loop. ``/health`` stays fast throughout (measured and printed; asserted loosely: the
machine is shared)."""

from __future__ import annotations

import asyncio
import gzip
import json
import select
import shutil
import socket
import time
import uuid
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from service import v2
from service.proto import grpc_predict_v2_pb2 as pb
from tests.service.conftest import (
    MODELS,
    address,
    free_port,
    get,
    probing,
    read_one,
    service_process,
    serving,
    start_and_fail,
)
from tests.service.test_service import HANDWRITTEN_DIMS, metric

HANDWRITTEN = MODELS / "handwritten"


def raw(url: str, request: bytes) -> bytes:
    """Send ``request`` on a fresh connection; the one answer to it."""
    with socket.create_connection(address(url), timeout=10) as conn:
        conn.sendall(request)
        return read_one(conn)


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


# --- headers and numbers are parsed defensively ---------------------------------------------------------


@pytest.fixture(scope="module")
def url():
    with serving(HANDWRITTEN) as base:
        yield base


MOR = np.full((1, 6), 0.5, np.float32).tobytes()


def v2_binary(header_length: str, extra: bytes = b"") -> bytes:
    header = json.dumps(
        {
            "inputs": [
                {"name": "mor", "datatype": "FP32", "shape": [1, 6], "parameters": {"binary_data_size": 24}}
            ]
        }
    ).encode()
    body = header + MOR
    return (
        b"POST /v2/models/handwritten/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
        + b"Inference-Header-Content-Length: " + header_length.encode() + b"\r\n"
        + extra + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
    )  # fmt: skip


@pytest.mark.parametrize("length", ["²", "1" * 5000, "0" * 5000 + "12", "-5", "1e3", "0x10", "٣"])
def test_an_odd_inference_header_content_length_is_a_400(url, length):
    answer = raw(url, v2_binary(length))
    assert status(answer) == 400, answer[:300]
    assert b"Inference-Header-Content-Length" in answer


@pytest.mark.parametrize("length", ["9" * 5000, "0" * 5000 + "7"])
@pytest.mark.parametrize("path", ["/predict", "/v2/models/handwritten/infer"])
def test_a_content_length_of_thousands_of_digits_is_never_a_500(url, path, length):
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {length}"
    significant = length.lstrip("0")
    body = b"{}".ljust(int(significant)) if len(significant) < 6 else b"{}"  # as long as declared
    answer = raw(url, head.encode() + b"\r\n\r\n" + body)
    assert status(answer) in (400, 413), answer[:300]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            b'{"inputs": [], "parameters": {"lambda": 1' + b"0" * 309 + b"}}",
            "parameters.lambda must be a positive",
        ),
        (b'{"inputs": [], "parameters": {"x": ' + b"[" * 1000 + b"]" * 1000 + b"}}", "nested too deeply"),
        (b'{"inputs": [], "id": ' + b"[" * 1000 + b"]" * 1000 + b"}", "not an inference request"),
        (
            b'{"inputs": [{"name": "mor", "datatype": "FP32", "shape": [1, 6], "data": '
            + b"[" * 1000
            + b"]" * 1000
            + b"}]}",
            "",
        ),
    ],
)
def test_huge_numbers_and_deep_nesting_in_a_v2_body_are_a_400(url, body, message):
    answer = httpx.post(
        url + "/v2/models/handwritten/infer", content=body, headers={"content-type": "application/json"}
    )
    assert answer.status_code == 400, answer.text
    assert message in answer.json()["error"]


PREDICT = json.dumps({"samples": [{"views": {"mor": [0.5, 0.25, 1.0, 0.0, 0.75, 0.1]}}]}).encode()


def test_every_gzip_member_is_read_and_bytes_after_the_data_are_a_400(url):
    """A gzip body of two members is the two (as gzip.decompress reads it); bytes after the compressed data
    (gzip or deflate) are refused, never ignored."""
    half = len(PREDICT) // 2
    for encoding, body, status in (
        ("gzip", gzip.compress(PREDICT[:half]) + gzip.compress(PREDICT[half:]), 200),
        ("gzip", gzip.compress(PREDICT) + b"junk", 400),
        ("deflate", zlib.compress(PREDICT) + b"\0", 400),
    ):
        answer = httpx.post(
            url + "/predict",
            content=body,
            headers={"content-type": "application/json", "content-encoding": encoding},
        )
        assert answer.status_code == status, (encoding, answer.text)
        if status == 400:
            message = answer.json()["error"]["message"]
            assert f"the {encoding} body has" in message and "after the end of its compressed data" in message


def test_probes_answer_head_and_no_path_redirects(url):
    for path in ("/health", "/ready", "/metrics", "/v2/health/live", "/v2/health/ready"):
        head = httpx.head(url + path)
        assert head.status_code == 200 and head.content == b"", path
    for path in ("/predict/", "/health/", "/v2/models/handwritten/"):
        answer = httpx.request(
            "GET" if "health" in path else "POST", url + path, headers={"host": "evil.example"}
        )
        assert answer.status_code == 404 and "location" not in answer.headers, path


# --- slow bodies, body memory, big answers --------------------------------------------------------------


def legitimate(url: str) -> httpx.Response:
    rng = np.random.default_rng(0)
    sample = {"views": {k: rng.random(d).tolist() for k, d in HANDWRITTEN_DIMS.items()}}
    return httpx.post(url + "/predict", json={"samples": [sample]}, timeout=30)


def test_slow_bodies_hold_no_predict_slot_and_are_cut():
    """64 sockets trickling a declared 100 kB body at a byte a second (as many as DBF_MAX_IN_FLIGHT): the
    others' requests are served meanwhile, /health stays fast, and the trickles get 408 and lose their
    connection."""
    with service_process("--model-dir", str(HANDWRITTEN)) as (url, _):
        host, port = url.removeprefix("http://").split(":")
        head = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        head += b"Content-Length: 100000\r\n\r\n"
        sockets = [socket.create_connection((host, int(port)), timeout=30) for _ in range(64)]
        try:
            for conn in sockets:
                conn.sendall(head + b"{")
            with probing(url, "64 uploads trickling a byte a second"):
                served = []
                for second in range(4):
                    for conn in sockets:
                        conn.sendall(b" ")
                    served.append(legitimate(url).status_code)
                    time.sleep(1 - 0.0 * second)
            assert served == [200] * 4, served
            cut = 0
            for conn in sockets:
                conn.settimeout(15)
                answer = conn.recv(65536)
                if answer:
                    assert status(answer) == 408 and b"connection: close" in answer.lower(), answer[:200]
                    cut += 1
            assert cut == len(sockets)
        finally:
            for conn in sockets:
                conn.close()


def _memory_cgroup(limit: int) -> Path | None:
    """A memory cgroup limited to ``limit`` bytes (cgroup v1's memory controller, or v2 where it holds the
    memory controller), or None where none can be made (not root, no cgroup file system)."""
    v1, v2 = Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup")
    if (v1 / "memory.limit_in_bytes").exists():
        root, limit_file = v1, "memory.limit_in_bytes"
    elif (
        "memory" in (v2 / "cgroup.controllers").read_text(errors="ignore").split()
        if (v2 / "cgroup.controllers").exists()
        else False
    ):
        root, limit_file = v2, "memory.max"
    else:
        return None
    group = root / f"dbf-test-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
        (group / limit_file).write_text(str(limit))
    except OSError:
        if group.exists():
            group.rmdir()
        return None
    return group


def _oom_kills(group: Path) -> int:
    for name in ("memory.events", "memory.oom_control"):
        path = group / name
        if path.exists():
            for line in path.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    return 0


@contextmanager
def _pod_memory(limit: int) -> Iterator[Path | None]:
    """A memory cgroup of ``limit`` bytes for the block (None where none can be made), removed after it: no
    process in it may have been killed for its memory by then."""
    group = _memory_cgroup(limit)
    try:
        yield group
        if group is not None:
            assert _oom_kills(group) == 0
    finally:
        if group is not None:
            group.rmdir()


async def _burst(url: str, body: bytes, headers: dict[str, str], n: int) -> list[int]:
    """``n`` concurrent ``POST /predict`` of ``body``: their statuses (0: no answer)."""
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=n)) as client:
        answers = await asyncio.gather(
            *(client.post(url + "/predict", content=body, headers=headers) for _ in range(n)),
            return_exceptions=True,
        )
    return [a.status_code if isinstance(a, httpx.Response) else 0 for a in answers]


def _memory(pid: int, field: str) -> int:
    """A process's ``VmRSS`` (resident bytes) or ``VmHWM`` (their peak), in bytes."""
    return int(Path(f"/proc/{pid}/status").read_text().split(f"{field}:")[1].split()[0]) * 1024


def test_bodies_declared_but_not_sent_hold_no_room_in_the_body_budget():
    """Four sockets declaring bodies that add up to DBF_BODY_MEMORY_BYTES, each sending one byte of it: their
    declared lengths were reserved up front, and every request with a body, REST's and gRPC's, got 503
    overloaded until the rate rule cut them 10 s later, again and again as they came back (the attack probe:
    four sockets and a few hundred bytes every 10 s kept every prediction out). Now a body holds room for
    the bytes it has sent; one declared past the whole budget is still refused at once."""
    budget = 16 << 20
    head = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
    head += b"\r\n"
    port = free_port()
    with serving(HANDWRITTEN, body_memory_bytes=budget, max_body_bytes=budget, grpc_port=port) as url:
        stalled = [socket.create_connection(address(url), timeout=10) for _ in range(4)]
        for conn in stalled:
            conn.sendall(head % (budget // 4) + b"{")
        time.sleep(0.2)
        sample = {"views": {"mor": [0.5, 0.25, 1.0, 0.0, 0.75, 0.1]}}
        answer = httpx.post(url + "/predict", json={"samples": [sample]}, timeout=10)
        assert answer.status_code == 200, answer.text
        request = pb.ModelInferRequest(model_name="handwritten")
        request.inputs.add(name="mor", datatype="FP32", shape=[1, 6])
        request.raw_input_contents.append(bytes(24))
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")(request.SerializeToString())
        with socket.create_connection(address(url), timeout=10) as conn:
            conn.sendall(head % (budget + 1))
            assert read_one(conn).startswith(b"HTTP/1.1 413 ")
        for conn in stalled:
            conn.close()


def test_concurrent_big_bodies_stay_within_the_pods_memory():
    """64 concurrent valid bodies of 8 MiB (the most DBF_MAX_BODY_BYTES takes): with the body memory budget
    the service never needs more than the Kubernetes pod's 1 GiB. Run in a memory cgroup of that size where
    one can be made (the kernel then kills a process that exceeds it), else judged by its peak RSS."""
    limit = 1 << 30
    rng = np.random.default_rng(1)
    sample = {"views": {k: rng.random(d).tolist() for k, d in HANDWRITTEN_DIMS.items()}}
    n = (8 << 20) // (len(json.dumps(sample)) + 2)  # as many samples as fit in 8 MiB
    body = json.dumps({"samples": [sample] * n}).encode()
    assert (7 << 20) < len(body) <= (8 << 20)
    env = {"DBF_MAX_BODY_BYTES": str(8 << 20)}  # unset, it would grow with the model (body_limit)
    with _pod_memory(limit) as group:
        with service_process("--model-dir", str(HANDWRITTEN), env=env, cgroup=group) as (url, proc):
            with probing(url, "64 concurrent 8 MiB bodies"):
                statuses = asyncio.run(_burst(url, body, {"content-type": "application/json"}, 64))
            peak = _memory(proc.pid, "VmHWM")
            assert httpx.get(url + "/health").status_code == 200  # alive
        megabytes, peak_megabytes = len(body) / 2**20, peak / 2**20
        print(
            f"64 x {megabytes:.1f} MiB: {sorted(set(statuses))}, peak RSS {peak_megabytes:.0f} MiB, {group}"
        )
        assert set(statuses) <= {200, 503} and statuses.count(200) >= 8, statuses
        assert peak < limit


def test_concurrent_compression_bombs_stay_within_the_body_budget():
    """256 concurrent gzip bodies of 9 kB, each inflating to 9 MiB (past DBF_MAX_BODY_BYTES), twice: every
    one is answered, 413 or, its decompressed bytes being reserved in the body budget as they are produced,
    503 once the budget is spent; over both bursts the service's RSS grows by at most DBF_BODY_MEMORY_BYTES
    and a margin (the decompressors' windows, connections, the allocator's slack), and it outlives a memory
    cgroup of the pod's 1 GiB where one can be made."""
    budget, margin, pod = 128 << 20, 64 << 20, 1 << 30
    bomb = gzip.compress(b" " * (9 << 20))
    assert len(bomb) < 10_000
    headers = {"content-type": "application/json", "content-encoding": "gzip"}
    # Set: unset, the limit would take 1024 HandWritten samples as JSON (service.repository.body_limit).
    env = {"DBF_BODY_MEMORY_BYTES": str(budget), "DBF_MAX_BODY_BYTES": str(8 << 20)}
    with _pod_memory(pod) as group:
        with service_process("--model-dir", str(HANDWRITTEN), env=env, cgroup=group) as (url, proc):
            assert asyncio.run(_burst(url, bomb, headers, 1)) == [413]  # warm: the codec thread, its arena
            before = _memory(proc.pid, "VmRSS")
            with probing(url, "256 concurrent gzip bombs, twice"):
                statuses = [
                    status for _ in range(2) for status in asyncio.run(_burst(url, bomb, headers, 256))
                ]
            grown = _memory(proc.pid, "VmHWM") - before
            assert httpx.get(url + "/health").status_code == 200  # alive
        print(
            f"2 x 256 gzip bombs: {sorted(set(statuses))} ({statuses.count(413)} x 413), RSS grew by at most "
            f"{grown / 2**20:.0f} MiB (budget {budget >> 20} MiB + {margin >> 20} MiB), {group}"
        )
        assert set(statuses) == {413, 503}, statuses
        assert grown < budget + margin


def test_bodies_refused_by_a_codec_are_freed_at_once():
    """Bodies of 7 MiB that are not JSON, 8 at once (within the budget), 8 times: each is a 400 from the
    codec thread, and its memory goes when it is answered, not at the next full garbage collection (rare:
    service.reload freezes the heap), so the service's RSS grows by the body budget and a margin (a decode's
    own buffers, the allocator's slack) at most."""
    budget, margin = 64 << 20, 64 << 20
    body = b"x" * (7 << 20)
    env = {"DBF_BODY_MEMORY_BYTES": str(budget)}
    with service_process("--model-dir", str(HANDWRITTEN), env=env) as (url, proc):
        headers = {"content-type": "application/json"}
        assert asyncio.run(_burst(url, body, headers, 1)) == [400]  # warm: the codec thread, its arena
        before = _memory(proc.pid, "VmRSS")
        statuses = [status for _ in range(8) for status in asyncio.run(_burst(url, body, headers, 8))]
        grown = _memory(proc.pid, "VmHWM") - before
    print(f"8 x 8 refused 7 MiB bodies: {sorted(set(statuses))}, RSS grew by at most {grown / 2**20:.0f} MiB")
    assert set(statuses) == {400}, statuses
    assert grown < budget + margin


def test_many_small_samples_render_off_the_event_loop():
    """32 clients asking 1024 one-view samples each (a 30 kB body, a 1 MB answer): /health stays fast,
    because the answers are rendered on the inference threads, whatever the body's size."""
    body = json.dumps({"samples": [{"views": {"mor": [0.5, 0.25, 1.0, 0.0, 0.75, 0.1]}}] * 1024}).encode()
    assert len(body) < 64 * 1024
    with service_process("--model-dir", str(HANDWRITTEN)) as (url, _):

        async def load(seconds: float) -> list[int]:
            statuses: list[int] = []
            stop = time.monotonic() + seconds
            async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=32)) as client:

                async def user() -> None:
                    while time.monotonic() < stop:
                        answer = await client.post(
                            url + "/predict", content=body, headers={"content-type": "application/json"}
                        )
                        statuses.append(answer.status_code)

                await asyncio.gather(*(user() for _ in range(32)))
            return statuses

        with probing(url, "32 clients asking 1024 small samples each"):
            statuses = asyncio.run(load(6))
    assert statuses and set(statuses) <= {200, 503}, set(statuses)


# --- answers: bounded before any work, rendered in slices -----------------------------------------------

WIDE_CLASSES, WIDE_DIMS = 10_000, {"image": 40, "text": 48}  # 1024 samples: 360 KB as binary tensors


def linear_head(dim: int, classes: int) -> bytes:
    """A linear ONNX head (features @ w, then ReLU: evidence >= 0) of ``classes`` outputs."""
    from onnx import TensorProto, helper

    from tests.service.test_operator_mistakes import onnx_head

    weights = np.random.default_rng(dim).random(dim * classes, dtype=np.float32)
    w = helper.make_tensor("w", TensorProto.FLOAT, [dim, classes], weights.tolist())
    nodes = [
        helper.make_node("MatMul", ["features", "w"], ["z"]),
        helper.make_node("Relu", ["z"], ["evidence"]),
    ]
    return onnx_head(nodes, [w], dim=dim, classes=classes)


def cub_with_linear_heads(model: Path, dims: dict[str, int], classes: int = 10) -> Path:
    """The CUB model copied to ``model`` (its name then ``model``'s), with linear heads of ``classes``
    outputs on views of ``dims``."""
    from tests.service.test_operator_mistakes import with_head, with_manifest

    shutil.copytree(MODELS / "cub", model)
    for view, dim in dims.items():
        with_head(model, view, linear_head(dim, classes), dim=dim)
    names = [f"class {k}" for k in range(classes)]
    with_manifest(model, lambda manifest: manifest.update(name=model.name, classes=names))
    return model


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> Path:
    """The CUB model made 'wide': heads of 10,000 classes on views of 40 and 48 features."""
    pytest.importorskip("onnx")
    return cub_with_linear_heads(tmp_path_factory.mktemp("models") / "wide", WIDE_DIMS, WIDE_CLASSES)


def wide_features(n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(n)
    return {view: rng.random((n, dim), dtype=np.float32) for view, dim in WIDE_DIMS.items()}


def wide_bodies(n: int) -> dict[str, tuple[bytes, dict[str, str], str]]:
    """``n`` samples for the wide model as each protocol sends them: body, headers, path."""
    features = wide_features(n)
    v1_body = {"samples": [{"views": {v: a[i].tolist() for v, a in features.items()}} for i in range(n)]}
    v2_json = {
        "inputs": [
            {"name": v, "datatype": "FP32", "shape": list(a.shape), "data": a.ravel().tolist()}
            for v, a in features.items()
        ]
    }
    json_type = {"content-type": "application/json"}
    return {
        "v1 JSON": (json.dumps(v1_body).encode(), json_type, "/v1/models/wide/predict"),
        "v2 JSON": (json.dumps(v2_json).encode(), json_type, "/v2/models/wide/infer"),
        "v2 binary": (*v2.encode_request(features), "/v2/models/wide/infer"),
    }


def peak_rss(pid: int) -> int:
    return int(Path(f"/proc/{pid}/status").read_text().split("VmHWM:")[1].split()[0]) * 1024


def test_an_answer_over_the_bound_is_a_413_before_any_head_runs(wide):
    """1024 samples of a 10,000-class model would be 51 million numbers (946 MB of JSON, 3 GB of RSS):
    each protocol's request gets a 413 naming the limit and how many samples fit, no head runs, and the
    service's memory stays small. The most samples that fit are answered."""
    per_sample = 50_014  # 10,000 classes and 2 views (service/outputs.py)
    fit = (1 << 20) // per_sample
    with service_process("--model-dir", str(wide)) as (url, proc):
        for protocol, (body, headers, path) in wide_bodies(1024).items():
            answer = httpx.post(url + path, content=body, headers=headers, timeout=60)
            assert answer.status_code == 413, (protocol, answer.text[:300])
            message = answer.text
            assert "DBF_MAX_ANSWER_VALUES" in message and f"send at most {fit} samples" in message, message
        assert metric(url, "dbf_predictions_total", model="wide", method="dbf") == 0  # no head ran
        peak = peak_rss(proc.pid)
        for protocol, (body, headers, path) in wide_bodies(fit).items():
            answer = httpx.post(url + path, content=body, headers=headers, timeout=60)
            assert answer.status_code == 200, (protocol, answer.text[:300])
        body, headers, path = wide_bodies(fit + 1)["v2 binary"]
        assert httpx.post(url + path, content=body, headers=headers).status_code == 413
    print(f"3 requests of 1024 samples refused: peak RSS {peak / 2**20:.0f} MiB")
    assert peak < 512 * 2**20


def test_a_model_whose_one_sample_passes_the_bound_is_refused(tmp_path, wide):
    """250,000 classes (heads that really give them) on 2 views: one sample's answer alone is 1.25 million
    numbers. Refused at start, naming the manifest and the setting, before any head is loaded."""
    from tests.service.test_operator_mistakes import any_dim_head, with_head, with_manifest

    model = shutil.copytree(wide, tmp_path / "wide")
    classes = 250_000
    for view, dim in WIDE_DIMS.items():
        with_head(model, view, any_dim_head(dim, classes), dim=dim)
    manifest = with_manifest(model, lambda m: m.update(classes=[f"c{k}" for k in range(classes)]))
    done = start_and_fail("--model-dir", str(model))
    assert done.returncode != 0
    from service.outputs import answer_values

    assert answer_values(classes, 2) > 1_250_000  # five numbers per class (or more) and a few per view
    assert (
        f"{manifest}: 250000 classes and 2 views make {answer_values(classes, 2)} numbers in one sample's "
        "answer; at most 1048576 are answered (DBF_MAX_ANSWER_VALUES)" in done.stderr
    ), done.stderr[-2000:]


def read_until_closed(conn: socket.socket) -> bytes:
    answer = bytearray()
    while chunk := conn.recv(1 << 20):
        answer += chunk
    return bytes(answer)


def test_health_answers_while_a_big_answer_is_encoded(wide):
    """A 256-sample answer of the wide model as JSON tensors (12.8 million numbers, 160 MB; allowed here)
    is encoded in slices on a thread: /health is answered again and again after its heads have run and
    before its answer starts (encoded in one go, the event loop waited for the GIL until it was done)."""
    n = 256
    body, headers = v2.encode_request(wide_features(n), binary_output=False)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    request = f"POST /v2/models/wide/infer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{head}"
    request += f"Content-Length: {len(body)}\r\n\r\n"
    env = {"DBF_MAX_ANSWER_VALUES": str(64 << 20)}
    with (
        service_process("--model-dir", str(wide), env=env) as (url, _),
        socket.create_connection(address(url), timeout=120) as big,
    ):
        big.sendall(request.encode() + body)
        deadline = time.monotonic() + 120  # not a measure: a guard against waiting forever
        while metric(url, "dbf_predictions_total", model="wide", method="dbf") < n:
            assert time.monotonic() < deadline, "the heads did not run"
            time.sleep(0.01)
        answered = 0  # /health answers received after the heads ran, the big answer not begun
        while answered < 3:
            assert get(url, "/health").startswith(b"HTTP/1.1 200 ")
            if select.select([big], [], [], 0)[0]:
                break
            answered += 1
        answer = read_until_closed(big)
    head, _, content = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), head
    outputs = json.loads(content)["outputs"]
    assert {o["name"]: o["shape"] for o in outputs}["view_belief"] == [n, 2, WIDE_CLASSES]
    assert answered == 3, f"/health answered {answered} times before the answer began"


def test_bodies_that_parse_into_many_times_their_size_are_refused_unparsed():
    """Within the body limit, bodies of two bytes an item (``{},`` ``[],`` ``0,``) or protobuf messages of
    many map entries made the parsers' memory 20 to 40 times their size, and their time seconds (a 30 MB
    JSON body took the service past 1 GiB and 17 s, then answered 200; a million entries took protobuf 31 s).
    Each is now refused before it is parsed, the service's peak memory growing by a few times the body at
    most."""
    grpc_port = free_port()
    one = {"name": "mor", "shape": [1, 6], "datatype": "FP32", "data": [0.5] * 6}
    objects = b"[" + b",".join([b"{}"] * 5_000_000) + b"]"  # 15 MB: within the limit, made by the models
    floods = {
        "v2, objects in a field not ours": ("/v2/models/handwritten/infer", b'{"inputs": [%s], "x": %s}'),
        "v1, arrays in a field not ours": ("/predict", b'{"samples": [{"views": {"mor": [%s]}}], "x": %s}'),
    }
    message = pb.ModelInferRequest(model_name="handwritten")
    for k in range(200_000):  # 2.8 MB of distinct keys: within the message limit (1024 samples' tensors)
        message.parameters[f"k{k}"].bool_param = True
    infer = message.SerializeToString()
    del message
    headers = {"content-type": "application/json"}
    with service_process("--model-dir", str(HANDWRITTEN), "--grpc-port", str(grpc_port)) as (url, proc):
        before = _memory(proc.pid, "VmRSS")
        statuses = {}
        for name, (path, template) in floods.items():
            first = json.dumps(one).encode() if path.startswith("/v2") else b"0.5, " * 5 + b"0.5"
            body = template % (first, objects if name.startswith("v2") else objects.replace(b"{}", b"[]"))
            answer = httpx.post(url + path, content=body, headers=headers, timeout=120)
            statuses[name] = answer.status_code, answer.text[:120]
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
            with pytest.raises(grpc.RpcError) as refused:
                call(infer, timeout=60)
        statuses["gRPC, 200,000 parameters"] = refused.value.code(), refused.value.details()[:80]
        grown = _memory(proc.pid, "VmHWM") - before
        assert httpx.get(url + "/health").status_code == 200
    print(statuses, f"peak RSS grew by {grown / 2**20:.0f} MiB")
    assert statuses["v2, objects in a field not ours"][0] == 413
    assert statuses["v1, arrays in a field not ours"][0] == 413
    assert statuses["gRPC, 200,000 parameters"][0] == grpc.StatusCode.INVALID_ARGUMENT
    assert grown < 8 * len(objects), f"{grown / 2**20:.0f} MiB"


def test_grpc_calls_without_the_key_are_refused_before_their_messages_are_read():
    """With DBF_API_KEY set, 64 concurrent ModelInfer calls of 3 MB (within the message limit) without it:
    each is UNAUTHENTICATED and the service never holds their messages. Before, gRPC read each message whole
    and the key was checked after: 32 calls of 35 MB (the limit then: JSON's size of 1024 samples, where
    their tensors take 3.3 MB) took a service past 1.5 GB. A message over the limit is refused by size."""
    grpc_port, key = free_port(), "grpc-secret"
    message = bytes(3 << 20)  # never parsed: refused on its metadata

    async def calls(n: int, body: bytes, metadata: tuple = ()) -> list[grpc.StatusCode]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
            answers = await asyncio.gather(
                *(infer(body, timeout=60, metadata=metadata) for _ in range(n)), return_exceptions=True
            )
        return [
            answer.code() if isinstance(answer, grpc.aio.AioRpcError) else grpc.StatusCode.OK
            for answer in answers
        ]

    env = {"DBF_API_KEY": key}
    args = ("--model-dir", str(HANDWRITTEN), "--grpc-port", str(grpc_port))
    with service_process(*args, env=env) as (url, proc):
        assert asyncio.run(calls(1, message)) == [grpc.StatusCode.UNAUTHENTICATED]  # warm
        before = _memory(proc.pid, "VmRSS")
        codes = asyncio.run(calls(64, message))
        grown = _memory(proc.pid, "VmHWM") - before
        too_big = asyncio.run(calls(1, bytes(4 << 20), (("authorization", f"Bearer {key}"),)))
        assert httpx.get(url + "/health").status_code == 200
    print(f"64 x 3 MB without the key: RSS grew by at most {grown / 2**20:.0f} MiB")
    assert set(codes) == {grpc.StatusCode.UNAUTHENTICATED}
    # gRPC buffers what each stream's flow-control window lets in before the refusal: 17-49 MiB measured,
    # against 236 MiB (the messages whole) before; half the messages' 192 MiB is the bound.
    assert grown < 96 << 20
    assert too_big == [grpc.StatusCode.RESOURCE_EXHAUSTED]
