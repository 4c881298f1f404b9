"""MatMulNBits for two rows or more in blocks of 32 (compiled/nbits_gemm.py): onnxruntime's
numbers bit for bit (MLAS's CompInt8 arithmetic), whatever the rows, columns, blocks, zero
points, bias and threads."""

from __future__ import annotations

import numpy as np
import pytest
from nbits_models import matmul_nbits, model, packed_weight, sessions
from onnx import TensorProto as TP
from onnx import helper, numpy_helper
from ort_bits import assert_ort_bits

import onnxrun
from onnxrun.providers.cpu.compiled import nbits_gemm

ort = pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.skipif(nbits_gemm.unavailable() is not None,
                                reason=f"compiled kernel: {nbits_gemm.unavailable()}")


@pytest.mark.parametrize("K,N,zp,bias", [
    (896, 1152, False, False),  # the 0.5b model's shapes: whole pairs of blocks
    (4864, 36, False, False),
    (96, 10, False, True),  # an odd number of blocks; N % 4 columns summed MLAS's other way
    (100, 13, True, True),  # K not whole blocks; zero points
    (224, 7, True, False),
    (288, 20, True, True),  # one row's passes of eight columns with zero points, odd blocks
])
@pytest.mark.parametrize("threads", [1, 2])
def test_bit_for_bit_onnxruntime(K, N, zp, bias, threads, monkeypatch):
    from onnxrun.providers.cpu.ops.contrib.quantization import MatMulNBits

    monkeypatch.setattr(MatMulNBits, "SPLIT_BYTES", 0)  # split over the threads
    monkeypatch.setattr(MatMulNBits, "SPLIT_ROW_BYTES", 0)  # one row too (compiled/spin.py)
    rng = np.random.default_rng(K + N)
    data = matmul_nbits(K, N, rng, zp=zp, bias=bias)
    sess, ref = sessions(data, threads, ort_threads=1)
    # one row (MLAS's M == 1 kernel, with and without zero points); rows in tiles and alone;
    # more than one pass of rows
    for M in (1, 2, 3, 7, 70):
        a = (rng.standard_normal((M, K)) * rng.uniform(0.1, 3, (M, 1))).astype(np.float32)
        a[:, :32] = 0  # an all-zero block
        got = sess.run(None, {"A": a})[0]
        want = ref.run(None, {"A": a})[0]
        assert_ort_bits(got, want, err=f"M={M}")


def test_three_dimensional_input_and_its_rows():
    rng = np.random.default_rng(5)
    data = matmul_nbits(128, 20, rng, zp=False, bias=True)
    a = rng.standard_normal((2, 9, 128)).astype(np.float32)
    sess = onnxrun.InferenceSession(_reshaped(data))
    ref = ort.InferenceSession(_reshaped(data), providers=["CPUExecutionProvider"])
    assert_ort_bits(sess.run(None, {"A": a})[0], ref.run(None, {"A": a})[0])


def test_one_row_shapes_remembered_per_call():
    """A decode step's row takes the one-row call with the shapes of the last row's A and Y
    remembered: rows of another shape after it (2-D, 3-D, more rows) get their own shapes
    and onnxruntime's bits, each time."""
    rng = np.random.default_rng(8)
    data = _reshaped(matmul_nbits(256, 40, rng, zp=False, bias=False))
    sess = onnxrun.InferenceSession(data)
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    kernel = sess._program.steps[0].kernel
    assert kernel.row1 is not None
    for shape in ((1, 1, 256), (1, 1, 256), (2, 1, 256), (1, 1, 256), (1, 3, 256),
                  (1, 1, 256)):
        a = rng.standard_normal(shape).astype(np.float32)
        got, want = sess.run(None, {"A": a})[0], ref.run(None, {"A": a})[0]
        assert got.shape == want.shape == shape[:-1] + (40,)
        assert_ort_bits(got, want, err=str(shape))
    assert kernel.row1[3] == ((1, 1, 256), (1, 1, 40))


def _reshaped(data: bytes) -> bytes:
    """The same model with A (batch, sequence, K), as the builder's models have it."""
    import onnx

    m = onnx.load_from_string(data)
    K = m.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    m.graph.input[0].CopyFrom(helper.make_tensor_value_info("A", TP.FLOAT, ["b", "s", K]))
    m.graph.output[0].CopyFrom(helper.make_tensor_value_info("Y", TP.FLOAT, None))
    return m.SerializeToString()


def test_codes_layout_and_block_sums():
    """quantize_rows: MLAS's codes (round half to even of a * 127 / amax), laid out per pair
    of blocks as [b even | b+1 even | b odd | b+1 odd], an odd last block in order; the scales
    four times each."""
    a = np.zeros((1, 96), np.float32)
    a[0, :64] = np.arange(64) - 20
    a[0, 64:] = np.linspace(-1, 1, 32)
    q, scale4, sums = nbits_gemm.quantize_rows(a)
    amax = np.array([20, 43, 1], np.float32)
    scale = scale4[:, ::4]
    assert np.array_equal(scale4[0], np.repeat(amax / np.float32(127), 4))
    codes = np.rint(a.reshape(3, 32) * (np.float32(127) / amax)[:, None]).astype(np.int8)
    assert np.array_equal(q[0, :64].reshape(2, 2, 16),
                          codes[:2].reshape(2, 16, 2).transpose(2, 0, 1))
    assert np.array_equal(q[0, 64:], codes[2])
    assert np.array_equal(sums[0], scale[0] * codes.sum(1).astype(np.float32))


def test_compiled_quantize_equals_numpy():
    rng = np.random.default_rng(9)
    for M, K in ((3, 96), (2, 100), (5, 4864)):
        a = (rng.standard_normal((M, K)) * 3).astype(np.float32)
        a[:, :32] = 0
        for x, y in zip(nbits_gemm.quantize(a), nbits_gemm.quantize_rows(a), strict=True):
            assert np.array_equal(x, y)


def test_llm_mlp_chain_equals_onnxruntime_bit_for_bit():
    """Two Qwen2-0.5b-width MLP blocks (gate/up 896 -> 4864, SiLU as the optimizer fuses it,
    down 4864 -> 896, residual) and an output projection, a 32-token prompt: every product
    quantizes its input to int8, so one differing last bit upstream would flip codes and
    grow; the logits are onnxruntime's to the bit."""
    rng = np.random.default_rng(11)
    H, F, V = 896, 4864, 512
    nodes, inits, x = [], [], "x"

    def nbits(name, src, K, N):
        inits.extend(packed_weight(rng, N, K // 32, 32, f"{name}."))
        nodes.append(helper.make_node("MatMulNBits", [src, f"{name}.B", f"{name}.S"], [name],
                                      domain="com.microsoft", K=K, N=N, block_size=32, bits=4,
                                      accuracy_level=4))
        return name

    for i in range(2):
        g, u = nbits(f"gate{i}", x, H, F), nbits(f"up{i}", x, H, F)
        nodes += [helper.make_node("Sigmoid", [g], [f"sig{i}"]),
                  helper.make_node("Mul", [g, f"sig{i}"], [f"silu{i}"]),
                  helper.make_node("Mul", [f"silu{i}", u], [f"h{i}"])]
        d = nbits(f"down{i}", f"h{i}", F, H)
        nodes.append(helper.make_node("Add", [x, d], [f"res{i}"]))
        x = f"res{i}"
    nodes.append(helper.make_node("Identity", [nbits("head", x, H, V)], ["logits"]))
    data = model(nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [1, 32, H])],
                 [helper.make_tensor_value_info("logits", TP.FLOAT, None)], inits)
    feed = {"x": (rng.standard_normal((1, 32, H)) * 0.5).astype(np.float32)}
    got = onnxrun.InferenceSession(data).run(None, feed)[0]
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feed)[0]
    assert_ort_bits(got, want, rtol=1e-3)


def test_one_row_split_only_where_it_gains():
    """At two threads one row's product goes to compiled/spin.py's workers only from
    SPLIT_ROW_BYTES of packed weight (a 896 x 1200 projection, 525 KiB, and up): a small
    model's products (its 256 x 2012 lm_head, 251 KiB) run on the calling thread without
    waking or holding a worker every token. The numbers are one thread's either way."""
    from onnxrun.providers.cpu.compiled import spin
    from onnxrun.providers.cpu.ops.contrib.quantization import MatMulNBits

    if spin.unavailable() is not None:
        pytest.skip(f"spinning workers: {spin.unavailable()}")
    rng = np.random.default_rng(9)
    forks = []
    real = spin.Pool.fork
    spin.Pool.fork = lambda self, *a: forks.append(1) or real(self, *a)
    try:
        for K, N, split in ((256, 2012, False), (896, 1200, True)):
            assert (K * N // 2 >= MatMulNBits.SPLIT_ROW_BYTES) == split
            data = matmul_nbits(K, N, rng, zp=False, bias=False)
            got = {}
            for threads in (1, 2):
                so = onnxrun.SessionOptions()
                so.intra_op_num_threads = threads
                sess = onnxrun.InferenceSession(data, so)
                a = np.random.default_rng(K).standard_normal((1, K)).astype(np.float32)
                forks.clear()
                got[threads] = sess.run(None, {"A": a})[0]
                assert bool(forks) == (split and threads == 2), (K, N, threads)
            assert got[1].tobytes() == got[2].tobytes()
    finally:
        spin.Pool.fork = real


@pytest.mark.parametrize("threads", [1, 2])
def test_computed_bias_bit_for_bit(threads, monkeypatch):
    """A bias that is not a constant (a graph input here): added inside the kernel, before
    the zero points' share, as MLAS does, for a decode step's row and a prompt's rows."""
    from onnxrun.providers.cpu.ops.contrib.quantization import MatMulNBits

    monkeypatch.setattr(MatMulNBits, "SPLIT_BYTES", 0)  # split over the threads too
    rng = np.random.default_rng(11)
    K, N = 896, 44
    inits = [*packed_weight(rng, N, K // 32, 32),
             numpy_helper.from_array(rng.integers(0, 256, N * 14, dtype=np.uint8), "Z")]
    node = helper.make_node("MatMulNBits", ["A", "B", "S", "Z", "", "b"], ["Y"],
                            domain="com.microsoft", K=K, N=N, block_size=32, bits=4,
                            accuracy_level=4)
    data = model([node], [helper.make_tensor_value_info("A", TP.FLOAT, ["b", "s", K]),
                          helper.make_tensor_value_info("b", TP.FLOAT, [N])],
                 [helper.make_tensor_value_info("Y", TP.FLOAT, None)], inits)
    sess, ref = sessions(data, threads, ort_threads=1)
    for shape in ((1, 1, K), (1, 7, K), (2, 9, K)):
        feed = {"A": (rng.standard_normal(shape) * 2).astype(np.float32),
                "b": rng.standard_normal(N).astype(np.float32)}
        assert_ort_bits(sess.run(None, feed)[0], ref.run(None, feed)[0], err=str(shape))
