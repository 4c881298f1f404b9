"""The light model-zoo models with BatchNormalization, their ConstantOfShape weights replaced
by random ones, at each optimization level against level 0 (see test_levels_zoo.py): with equal
weights every channel is alike, and a per-channel folding along the wrong axis would not show."""

from __future__ import annotations

from pathlib import Path

import pytest
from zoo_helpers import NAMES, check_levels, has_batchnorm


@pytest.mark.parametrize("name", [n for n in NAMES if has_batchnorm(n)])
def test_random_weights_levels_give_level_0_outputs(name: str, tmp_path: Path) -> None:
    check_levels(name, "random", tmp_path)
