"""The v1 codec's JSON decoding: the fast path (simdjson, every view's numbers straight into an array) gives
exactly what the strict path gives, and every refusal carries the strict path's message."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.errors import InvalidInput, PayloadTooLarge
from service.json_numbers import opening_brackets
from service.repository import load_repository
from service.runtime import predict
from service.settings import Settings
from service.v1 import _parse_fast as _parse_fast_counted
from service.v1 import _parse_strict, encode, parse

MODELS = Path(__file__).resolve().parents[2] / "models"
MODEL = load_repository(Settings(model_dir=MODELS / "handwritten")).get().signature
DIMS = {view.name: view.dim for view in MODEL.views}
NUMBERS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.integers(-(10**6), 10**6),
    st.sampled_from([0.0, -0.0, 1e-45, 3.4028234663852886e38, -3.4e38, 1e308]),
)


@st.composite
def bodies(draw) -> bytes:
    """Valid-looking bodies: any non-empty subset of views per sample, integers and extreme floats, optional
    fusion options, random whitespace between tokens."""
    samples = []
    for _ in range(draw(st.integers(1, 4))):
        names = draw(st.lists(st.sampled_from(sorted(DIMS)), min_size=1, max_size=6, unique=True))
        samples.append(
            {"views": {n: draw(st.lists(NUMBERS, min_size=DIMS[n], max_size=DIMS[n])) for n in names}}
        )
    body: dict = {"samples": samples}
    if draw(st.booleans()):
        body["method"] = draw(st.sampled_from(["dbf", "gbaf", "cbf", "bcf", "baf", "xyz"]))
    if draw(st.booleans()):
        body["lambda"] = draw(st.one_of(st.floats(0.1, 10), st.integers(1, 3), st.just(-1.0)))
    separators = draw(st.sampled_from([(",", ":"), (", ", ": "), (",\n ", " :\t")]))
    return json.dumps(body, separators=separators).encode()


def _parse_fast(body: bytes, signature, max_samples: int):
    """v1's fast reader as :func:`service.v1.parse` calls it, the body's brackets counted."""
    return _parse_fast_counted(body, signature, max_samples, opening_brackets(body))


def outcome(parser, body: bytes):
    try:
        batch = parser(body, MODEL, 8)
    except (InvalidInput, PayloadTooLarge) as error:
        return type(error), error.message
    if batch is None:
        return None
    return batch.method, batch.lam, batch.present.tolist(), {k: v.tolist() for k, v in batch.features.items()}


@given(body=bodies())
def test_the_fast_path_agrees_with_the_strict_one(body):
    fast, strict = outcome(_parse_fast, body), outcome(_parse_strict, body)
    assert fast is None or fast == strict  # None: the fast path declined, and the strict one decides
    assert outcome(lambda b, m, n: parse(b, m, max_samples=n), body) == strict


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            b'{"samples": [{"views": {"mor": [1, 2, 3, 4, 5, 6], "mor": [1, 2, 3, 4, 5, 6]}}]}',
            "duplicate key",
        ),
        (
            b'{"samples": [{"views": {"mor": [1, 2, 3, 4, 5, 6], "m\\u006fr": [1, 2, 3, 4, 5, 6]}}]}',
            "duplicate",
        ),
        (b'{"samples": [], "samples": [{"views": {"mor": [1, 2, 3, 4, 5, 6]}}]}', "duplicate key"),
        (  # whitespace before a colon: the colon count alone cannot vouch for the keys
            b'{"samples": [{"views": {"mor" : [1, 2, 3, 4, 5, 6], "mor"\n: [1, 2, 3, 4, 5, 6]}}]}',
            "duplicate key",
        ),
        (
            b'{"samples": [{"views": {"mor": [1, 2, 3, 4, 5, 1e39]}}]}',
            "samples[0].views.mor: values must fit",
        ),
        (b'{"samples": [{"views": {"mor": [1, 2, 3, 4, 5, true]}}]}', "samples[0].views.mor[5]: every value"),
        (b'{"samples": [{"views": {"mor": [1, 2, 3, 4, 5]}}]}', "samples[0].views.mor: expected 6 values"),
        (
            b'{"samples": [{"views": {"mor": [1, 2, 3, 4, 5, 6]}}], "lambda": 0}',
            "'lambda' must be a positive",
        ),
        (b'{"samples": [{"views": {}}]}', "samples[0] has no views"),
    ],
)
def test_refusals_carry_the_strict_message(raw, message):
    with pytest.raises(InvalidInput) as caught:
        parse(raw, MODEL, max_samples=8)
    assert message in caught.value.message
    assert _parse_fast(raw, MODEL, 8) is None


@pytest.mark.parametrize(
    "raw",
    [
        '{"samples": [{"views": {"mor": [[1], 2, 3, 4, 5, 6]}}]}',  # as many numbers, one of them nested
        '{"samples": [{"views": {"mor": [[1], [2], [3], [4], [5], [6]]}}]}',
        '{"samples": [{"views": {"mor": [[1, 2], [], 3, 4, 5, 6]}}]}',
        '{"samples": [{"views": {"mor": [1, 2, 3, 4, 5, 18446744073709551616]}}]}',  # beyond 64 bits
        '{"samples": [{"views": {"mor": [1, 2, 3, 4, 5, 1e400]}}]}',  # beyond float64
        '{"samples": [{"views": {"mor": [1, 2, 3, 4, 5, null]}}]}',
        '{"samples": [{"views": {"mor": [1, 2, 3, 4, 5, "6"]}}]}',
        '{"samples": [{"views": {"mor": [1, 2, 3, 4, 5, {"x": 6}]}}]}',
        '{"samples": [{"views": {"mor": 6}}]}',
        '{"samples": [{"views": {"mor": MOR, "[x]": MOR}}]}',
        '{"samples": [{"views": {"mor": MOR}, "extra": 1}]}',
        '{"samples": [{"views": [MOR]}]}',
        '{"samples": [[MOR]]}',
        '{"samples": {"views": {"mor": MOR}}}',
        '{"samples": [{"views": {"mor": MOR}}], "method": ["dbf"]}',
        '{"samples": [{"views": {"mor": MOR}}], "method": "[dbf]"}',
        '{"samples": [{"views": {"mor": MOR}}], "lambda": {"x": 1}}',
        '{"samples": [{"views": {"mor": MOR}}], "lambda": true}',
        '{"samples": [{"views": {"mor": MOR}}], "lambda": 2}',
        '{"samples": [{"views": {"mor": MOR}}], "lambda": null}',
        '{"samples": [{"views": {"mor": MOR}}], "coverage": null}',
        '{"samples": [{"views": {"mor": MOR}}], "coverage": 1}',
        '{"samples": [{"views": {"mor": MOR}}], "extra": [1]}',
        '{"samples": [{"views": {"mor": MOR}}]} []',
        '[{"samples": [{"views": {"mor": MOR}}]}]',
        '{"samples": [{"views": {"m\\u006fr": MOR}}]}',  # an escaped name: the same view
        '{"samples": [{"views": {"mor": MOR}}], "samples": [{"views": {"mor": MOR}}]}',
        '{"samples": [{"views": {"mor": ' + "[" * 2000 + "]" * 2000 + "}}]}",
    ],
)
def test_unusual_bodies_get_the_strict_answer(raw):
    """Whatever the fast path reads, it reads as the strict path does, or it leaves the body to it."""
    body = raw.replace("MOR", "[1, 2, 3, 4, 5, 6]").encode()
    fast, strict = outcome(_parse_fast, body), outcome(_parse_strict, body)
    assert fast is None or fast == strict
    assert outcome(lambda b, m, n: parse(b, m, max_samples=n), body) == strict


@pytest.mark.parametrize("separators", [(",", ":"), (", ", ": "), (",\n ", " :\t")])
@pytest.mark.parametrize("n", [1, 3])
def test_ordinary_bodies_take_the_fast_path(separators, n):
    rng = np.random.default_rng(n)
    samples = [{"views": {name: rng.random(dim).tolist() for name, dim in DIMS.items()}} for _ in range(n)]
    body = json.dumps({"samples": samples, "method": "dbf", "lambda": 2}, separators=separators).encode()
    batch = _parse_fast(body, MODEL, 8)
    assert batch is not None and outcome(_parse_fast, body) == outcome(_parse_strict, body)
    for name, dim in DIMS.items():  # what onnxruntime is handed: C-ordered (N, dim) float32
        features = batch.features[name]
        assert features.shape == (n, dim) and features.dtype == np.float32 and features.flags.c_contiguous
        assert features.tolist() == np.array([s["views"][name] for s in samples], np.float32).tolist()


def test_too_many_samples_is_a_413_on_both_paths():
    body = json.dumps({"samples": [{"views": {"mor": [0.5] * 6}}] * 9}).encode()
    for parser in (_parse_fast, _parse_strict):
        with pytest.raises(PayloadTooLarge, match="9 samples in one request; at most 8"):
            parser(body, MODEL, 8)


def test_missing_views_are_absent_and_take_no_room():
    """A view has rows for the samples that sent it only, in sample order: nothing is allocated for a view
    not sent (zeros at its dimension could take more memory than the whole body)."""
    body = (
        b'{"samples": [{"views": {"mor": [1, 2, 3, 4, 5, 6]}}, {"views": {"kar": '
        + json.dumps([0.25] * 64).encode()
        + b'}}, {"views": {"mor": [6, 5, 4, 3, 2, 1], "kar": '
        + json.dumps([0.5] * 64).encode()
        + b"}}]}"
    )
    for parser in (_parse_fast, _parse_strict):
        batch = parser(body, MODEL, 8)
        assert batch is not None
        mor, kar = list(DIMS).index("mor"), list(DIMS).index("kar")
        assert batch.present[:, [mor, kar]].tolist() == [[1, 0], [0, 1], [1, 1]]
        assert batch.features["mor"].dtype == np.float32
        assert batch.features["mor"].tolist() == [[1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1]]
        assert batch.features["kar"].tolist() == [[0.25] * 64, [0.5] * 64]
        assert batch.features["pix"].shape == (0, 240)


def test_requests_of_many_samples_some_views_missing_read_the_same():
    """90 samples, every third without four of its views: the same request on both paths, and the answer
    the same as each sample's alone."""
    rng = np.random.default_rng(7)
    samples = []
    for i in range(90):
        names = list(DIMS) if i % 3 else ["mor", "pix"]
        samples.append({"views": {n: rng.random(DIMS[n]).tolist() for n in names}})
    body = json.dumps({"samples": samples, "lambda": 2.0, "coverage": 0.8}).encode()
    assert _parse_fast(body, MODEL, 128) is not None
    assert outcome(_parse_fast, body) == outcome(_parse_strict, body)
    model = load_repository(Settings(model_dir=MODELS / "handwritten")).get()
    result = predict(model, parse(body, MODEL, max_samples=128))
    content, _ = encode(MODEL, result)
    whole = {
        "model": "handwritten",
        "method": "dbf",
        "lambda": 2.0,
        "coverage": result.coverage,
        "views": list(DIMS),
        "predictions": [
            json.loads(encode(MODEL, result.rows(i, i + 1))[0])["predictions"][0] for i in range(90)
        ],
    }
    assert json.loads(content) == whole
