"""The fit-quality benchmark's data sets, written as a user brings them, read back as they are."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.fit_datasets import DATASETS, load, write_npy_directory
from training.readers import load as read_user_data


@pytest.mark.parametrize("name", list(DATASETS))
def test_every_bundled_data_set_reads_back_as_written(tmp_path, name):
    if name == "penguins":
        pytest.importorskip("palmerpenguins")
    data = load(name)
    split = np.arange(data.num_samples) % 3
    read = read_user_data(write_npy_directory(data, tmp_path / name, split=split), split_column="split")
    assert read.class_names == data.class_names and np.array_equal(read.labels, data.labels)
    assert sorted(read.view_names) == sorted(data.view_names) and np.array_equal(read.split, split)
    for view in data.view_names:
        np.testing.assert_array_equal(read.views[view], data.views[view])
    assert len(data.view_names) >= 2 and data.num_classes >= 2


def test_the_missing_view_set_lacks_one_view_for_30_percent_of_its_samples():
    data = load("missing_view")
    assert data.missing_rates() == {"a": 0.0, "b": 0.0, "c": pytest.approx(0.3)}
    assert data.present.any(axis=1).all()
