"""benchmarks.device_parity, which needs a GPU to mean anything, run here with the CPU on both sides: every
sample of a model's data answered, every output compared, identical providers differing nowhere."""

from __future__ import annotations

import pytest

from benchmarks import device_parity

pytestmark = pytest.mark.data


def test_the_comparison_covers_every_sample_and_output(data_dir, monkeypatch):
    answers = device_parity.answers
    devices = []

    def on_the_cpu(model_dir, device, views, batch):
        devices.append(device)
        return answers(model_dir, "cpu", views, batch)

    monkeypatch.setattr(device_parity, "answers", on_the_cpu)
    row = device_parity.compare(device_parity.ROOT / "models" / "pie", data_dir, batch=256)
    assert devices == ["cpu", "cuda"]
    assert row == {"samples": 680, **dict.fromkeys(device_parity.NUMERIC, 0.0)} | dict.fromkeys(
        device_parity.DISCRETE, 0
    )
