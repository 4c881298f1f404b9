"""Every light model-zoo model at each optimization level gives level 0's outputs.

The light models (onnx/backend/test/data/light) build their weights with ConstantOfShape, so
every weight tensor holds one repeated value (0.02): all channels of every layer are equal, the
1000 logits are equal in exact arithmetic (the softmax a uniform 0.001) and, for the deep plain
nets (VGG, AlexNet, Inception), they are huge (up to 1e31). So:

* the logits (the input of the final Softmax) are compared too, and the softmax within what the
  logits' difference allows: a kernel that rounds some channels differently (OpenBLAS's and
  MLAS's on AVX2 do) leaves SqueezeNet's logits of 7e9 an ulp (512) apart, and its softmax far
  from uniform;
* a "random" variant of the models with BatchNormalization (where per-channel folding happens:
  Conv+BatchNormalization, Conv*Mul, Conv+Add) replaces every ConstantOfShape weight by random
  values of a sensible scale (He-initialized weights, statistics near 0 / 1), so channels differ
  and a folding along the wrong axis would show. The shipped variant exercises what the repeated
  weights allow: constant sharing, then common-subexpression elimination of equal convolutions.

Criterion: rtol 1e-4, atol 1e-5 plus 1e-4 of the output's largest magnitude. Rewrites change
the order and grouping of floating-point sums, whose rounding is proportional to the magnitude of
the terms, not of the result: a logit of 95 computed from terms of 7e4 (ResNet-50's random
variant) or of 1e31 (VGG-19's shipped one) moves by more than 1e-4 of itself.

A level whose report equals a lower level's (no extra pass changed anything) produced the same
graph and is not run again. Each saved optimized model (``optimized_model_filepath``) must pass
onnx's checker; the most rewritten one, unless it holds onnxrun's own ai.onnxrun operators, must
run in onnxruntime with the same results (the same criterion with 1e-3: two engines, two
convolution algorithms). ResNet-50 keeps no BatchNormalization at any level >= 1.

The random variant is in test_levels_zoo_random.py (so that each file stays under a minute); the
code both share is in zoo_helpers.py.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from zoo_helpers import LIGHT, NAMES, check_levels, has_batchnorm


@pytest.mark.parametrize("name", NAMES)
def test_levels_give_level_0_outputs(name: str, tmp_path: Path) -> None:
    check_levels(name, "shipped", tmp_path)


def test_resnet50_has_batchnorm_to_fold() -> None:
    """What the check relies on: the shipped ResNet-50 has 53 Conv + BatchNormalization pairs."""
    model = onnx.load(str(LIGHT / "light_resnet50.onnx"), load_external_data=False)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("BatchNormalization") == ops.count("Conv") == 53
    assert has_batchnorm("resnet50")
