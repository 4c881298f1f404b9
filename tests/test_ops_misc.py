"""Loss, signal, image, text, random, training and miscellaneous math operators.

Each family is checked against its ONNX conformance cases and, where onnxruntime implements the
op, against onnxruntime on extra random inputs (the ONNX reference evaluator otherwise).
Random operators cannot be compared by value: they are judged on shape, dtype, value range,
coarse statistics and seeded reproducibility.
"""

from __future__ import annotations

import io
import struct
import sys
import warnings
import zlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxrun
from onnxrun.errors import OnnxRunError

ort = pytest.importorskip("onnxruntime")

# -- helpers ----------------------------------------------------------------------------------


def _make_model(op_type, inputs, outputs, opset, domain="", **attrs):
    """One-node model; ``inputs`` is a list of (name, array or None for an omitted input)."""
    node = helper.make_node(op_type, [n if a is not None else "" for n, a in inputs],
                            outputs, domain=domain, **attrs)
    vis = [helper.make_tensor_value_info(
        n, helper.np_dtype_to_tensor_dtype(a.dtype) if a.dtype != object else TensorProto.STRING,
        a.shape) for n, a in inputs if a is not None]
    outs = [helper.make_value_info(o, onnx.TypeProto()) for o in outputs]
    imports = [helper.make_opsetid("", opset)]
    if domain:
        imports.append(helper.make_opsetid(domain, 1))
    model = helper.make_model(helper.make_graph([node], "g", vis, outs), opset_imports=imports)
    model.ir_version = 10
    return model


def _feeds(inputs):
    return {n: a for n, a in inputs if a is not None}


def _run(model, feeds):
    return onnxrun.InferenceSession(model.SerializeToString()).run(None, feeds)


def _run_ort(model, feeds):
    return ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)


def _check(op_type, inputs, outputs, opset, rtol=1e-5, atol=1e-5, domain="", oracle="ort",
           check_dtype=True, **attrs):
    model = _make_model(op_type, inputs, outputs, opset, domain, **attrs)
    feeds = _feeds(inputs)
    got = _run(model, feeds)
    if oracle == "ort":
        want = _run_ort(model, feeds)
    else:
        from onnx.reference import ReferenceEvaluator

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = ReferenceEvaluator(model).run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        w = np.asarray(w)
        assert g.shape == w.shape, (g.shape, w.shape)
        if w.dtype == object or w.dtype.kind == "U":
            assert g.dtype == object
            assert g.tolist() == w.tolist()
        else:
            assert g.dtype == w.dtype or not check_dtype, (g.dtype, w.dtype)
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol,
                                       atol=atol)
    return got


rng = np.random.default_rng(1234)

# -- conformance ------------------------------------------------------------------------------

_MY_OPS = {
    "SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss", "DFT", "STFT", "HannWindow",
    "HammingWindow", "BlackmanWindow", "MelWeightMatrix", "GridSample", "AffineGrid",
    "RoiAlign", "NonMaxSuppression", "Col2Im", "DeformConv", "CenterCropPad", "MaxUnpool",
    "ImageDecoder", "MaxRoiPool", "StringNormalizer", "StringConcat", "StringSplit",
    "RegexFullMatch", "TfIdfVectorizer", "RandomNormal", "RandomUniform", "RandomNormalLike",
    "RandomUniformLike", "Bernoulli", "Multinomial", "Adagrad", "Adam", "Momentum", "Det",
    "CumProd", "BitCast", "Swish",
}
_RANDOM_OPS = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
               "Bernoulli", "Multinomial"}


def _conformance_cases():
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)
    picked = []
    for c in cases:
        ops = {n.op_type for n in c.model.graph.node}
        # expanded variants (function bodies) count too when they reach one of our ops
        if c.model.graph.node and (c.model.graph.node[0].op_type in _MY_OPS
                                   or ops & _RANDOM_OPS):
            picked.append(c)
    return picked


_CASES = _conformance_cases()


@pytest.mark.parametrize("case", _CASES, ids=[c.name for c in _CASES])
def test_conformance(case):
    names = [i.name for i in case.model.graph.input]
    ops = {n.op_type for n in case.model.graph.node}
    sess = onnxrun.InferenceSession(case.model.SerializeToString())
    for inputs, expected in case.data_sets:
        got = sess.run(None, dict(zip(names, inputs, strict=True)))
        for g, e in zip(got, expected, strict=True):
            e = np.asarray(e)
            assert g.shape == e.shape
            if e.dtype == object:
                assert g.tolist() == e.tolist()
                continue
            assert g.dtype == e.dtype
            if ops & _RANDOM_OPS:
                # values are implementation-defined: Bernoulli gives 0/1 of the right type
                assert np.isin(g, (0, 1)).all()
                continue
            np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64),
                                       rtol=case.rtol, atol=case.atol, equal_nan=True)


# -- losses -----------------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("shape", [(5, 4), (3, 4, 2, 3)])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore", [None, 1])
def test_losses_vs_ort(reduction, shape, weighted, ignore):
    x = rng.standard_normal(shape).astype(np.float32)
    labels = rng.integers(0, shape[1], (shape[0], *shape[2:])).astype(np.int64)
    w = rng.uniform(0.5, 2, shape[1]).astype(np.float32) if weighted else None
    attrs = {"reduction": reduction}
    if ignore is not None:
        attrs["ignore_index"] = ignore
    _check("SoftmaxCrossEntropyLoss", [("x", x), ("y", labels), ("w", w)], ["loss", "logp"],
           13, **attrs)
    logp = x - np.log(np.exp(x).sum(1, keepdims=True))
    _check("NegativeLogLikelihoodLoss", [("x", logp), ("y", labels), ("w", w)], ["loss"], 13,
           **attrs)


def test_loss_double_and_out_of_range_ignore():
    x = rng.standard_normal((4, 3)).astype(np.float64)
    labels = np.array([0, -100, 2, -100], dtype=np.int64)
    _check("SoftmaxCrossEntropyLoss", [("x", x), ("y", labels)], ["loss"], 13,
           ignore_index=-100)


# -- signal -----------------------------------------------------------------------------------


@pytest.mark.parametrize("complex_in", [False, True])
@pytest.mark.parametrize("axis", [1, 2, -2])
@pytest.mark.parametrize("inverse", [0, 1])
def test_dft_vs_ort(complex_in, axis, inverse):
    x = rng.standard_normal((2, 6, 5, 2 if complex_in else 1)).astype(np.float32)
    for length in (None, 4, 9):
        inputs = [("x", x), ("n", None if length is None else np.array(length, np.int64)),
                  ("axis", np.array(axis, np.int64))]
        _check("DFT", inputs, ["y"], 20, rtol=1e-4, atol=1e-4, inverse=inverse)
    if not complex_in and not inverse:
        _check("DFT", [("x", x), ("n", None), ("axis", np.array(axis, np.int64))], ["y"], 20,
               rtol=1e-4, atol=1e-4, onesided=1)
    if axis >= 0:
        _check("DFT", [("x", x)], ["y"], 17, rtol=1e-4, atol=1e-4, axis=axis, inverse=inverse)


def test_irfft_roundtrip():
    x = rng.standard_normal((3, 8, 1)).astype(np.float64)
    spec = _run(_make_model("DFT", [("x", x)], ["y"], 20, onesided=1), {"x": x})[0]
    back = _run(_make_model("DFT", [("x", spec)], ["y"], 20, onesided=1, inverse=1),
                {"x": spec})[0]
    np.testing.assert_allclose(back, x, atol=1e-12)


@pytest.mark.parametrize("onesided", [0, 1])
def test_stft_vs_ort(onesided):
    sig = rng.standard_normal((2, 64, 1)).astype(np.float32)
    win = np.hanning(16).astype(np.float32)
    _check("STFT", [("s", sig), ("step", np.array(8, np.int64)), ("w", win)], ["y"], 17,
           rtol=1e-4, atol=1e-4, onesided=onesided)
    _check("STFT", [("s", sig), ("step", np.array(5, np.int64)), ("w", None),
                    ("len", np.array(12, np.int64))], ["y"], 17, rtol=1e-4, atol=1e-4,
           onesided=onesided)


@pytest.mark.parametrize("op_type", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows_vs_ort(op_type, periodic):
    for size in (1, 7, 32):
        _check(op_type, [("n", np.array(size, np.int64))], ["y"], 17, rtol=1e-5, atol=1e-6,
               periodic=periodic)
    _check(op_type, [("n", np.array(10, np.int64))], ["y"], 17, periodic=periodic,
           output_datatype=TensorProto.DOUBLE)


@pytest.mark.parametrize("cfg", [(8, 256, 16000, 20.0, 8000.0), (20, 512, 22050, 0.0, 11025.0),
                                 (4, 64, 8000, 300.0, 3500.0)])
def test_mel_weight_matrix_vs_ort(cfg):
    bins, dft, rate, lo, hi = cfg
    inputs = [("a", np.array(bins, np.int64)), ("b", np.array(dft, np.int64)),
              ("c", np.array(rate, np.int64)), ("d", np.array(lo, np.float32)),
              ("e", np.array(hi, np.float32))]
    _check("MelWeightMatrix", inputs, ["y"], 17)


# -- image ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_vs_ort(mode, padding, align):
    x = rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
    grid = rng.uniform(-1.4, 1.4, (2, 4, 7, 2)).astype(np.float32)
    _check("GridSample", [("x", x), ("g", grid)], ["y"], 20, rtol=1e-4, atol=1e-5, mode=mode,
           padding_mode=padding, align_corners=align)
    old = {"linear": "bilinear", "cubic": "bicubic"}.get(mode, mode)
    _check("GridSample", [("x", x), ("g", grid)], ["y"], 16, rtol=1e-4, atol=1e-5, mode=old,
           padding_mode=padding, align_corners=align)


@pytest.mark.parametrize("mode", ["linear", "nearest"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
def test_grid_sample_3d(mode, padding):
    x = rng.standard_normal((1, 2, 4, 5, 6)).astype(np.float32)
    grid = rng.uniform(-1.2, 1.2, (1, 3, 4, 2, 3)).astype(np.float32)
    _check("GridSample", [("x", x), ("g", grid)], ["y"], 22, rtol=1e-4, atol=1e-5,
           oracle="reference", mode=mode, padding_mode=padding)


@pytest.mark.parametrize("align", [0, 1])
def test_affine_grid_vs_ort(align):
    theta = rng.standard_normal((2, 2, 3)).astype(np.float32)
    _check("AffineGrid", [("t", theta), ("s", np.array([2, 3, 5, 7], np.int64))], ["g"], 20,
           align_corners=align)
    theta3 = rng.standard_normal((2, 3, 4)).astype(np.float32)
    _check("AffineGrid", [("t", theta3), ("s", np.array([2, 1, 3, 4, 5], np.int64))], ["g"],
           20, align_corners=align)


def _rois(n, h, w):
    x1 = rng.uniform(-2, w, n)
    y1 = rng.uniform(-2, h, n)
    return np.stack([x1, y1, x1 + rng.uniform(0, w, n), y1 + rng.uniform(0, h, n)],
                    1).astype(np.float32)


@pytest.mark.parametrize("ctm", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("ratio", [0, 2])
def test_roi_align_vs_ort(ctm, mode, ratio):
    x = rng.standard_normal((2, 3, 10, 12)).astype(np.float32)
    rois = _rois(6, 10, 12)
    idx = rng.integers(0, 2, 6).astype(np.int64)
    _check("RoiAlign", [("x", x), ("r", rois), ("b", idx)], ["y"], 16, rtol=1e-4, atol=1e-5,
           coordinate_transformation_mode=ctm, mode=mode, output_height=3,
           output_width=4, sampling_ratio=ratio, spatial_scale=0.9)


def test_max_roi_pool_vs_ort():
    x = rng.standard_normal((2, 3, 9, 11)).astype(np.float32)
    rois = np.concatenate([rng.integers(0, 2, (5, 1)), _rois(5, 9, 11)], 1).astype(np.float32)
    _check("MaxRoiPool", [("x", x), ("r", rois)], ["y"], 21, pooled_shape=[3, 2],
           spatial_scale=0.8)


@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize("score_thr", [None, 0.3])
def test_nms_vs_ort(center, score_thr):
    xy = rng.uniform(0, 10, (2, 60, 2))
    wh = rng.uniform(1, 4, (2, 60, 2))
    if center:
        boxes = np.concatenate([xy, wh], -1)
    else:
        boxes = np.concatenate([xy, xy + wh], -1)[..., [1, 0, 3, 2]]
    boxes = boxes.astype(np.float32)
    scores = rng.uniform(0, 1, (2, 3, 60)).astype(np.float32)
    scores[0, 0, 5:9] = 0.75  # ties: lower box index first
    inputs = [("b", boxes), ("s", scores), ("m", np.array([7], np.int64)),
              ("i", np.array([0.3], np.float32)),
              ("t", None if score_thr is None else np.array([score_thr], np.float32))]
    _check("NonMaxSuppression", inputs, ["y"], 11, center_point_box=center)


def test_nms_many_boxes_vs_ort():
    # several blocks of the blocked greedy pass, and a max_output larger than the candidates
    xy = rng.uniform(0, 60, (1, 1500, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(2, 9, (1, 1500, 2))], -1).astype(np.float32)
    scores = rng.uniform(0, 1, (1, 2, 1500)).astype(np.float32)
    for limit in (40, 5000):
        inputs = [("b", boxes), ("s", scores), ("m", np.array([limit], np.int64)),
                  ("i", np.array([0.4], np.float32))]
        _check("NonMaxSuppression", inputs, ["y"], 11)


def test_roi_align_degenerate_vs_ort():
    x = rng.standard_normal((1, 2, 6, 7)).astype(np.float32)
    rois = np.array([[3, 3, 3, 3], [5, 4, 2, 1], [-9, -9, -8, -8], [30, 30, 40, 40],
                     [0, 0, 7, 6]], np.float32)
    idx = np.zeros(5, np.int64)
    for ctm in ("half_pixel", "output_half_pixel"):
        _check("RoiAlign", [("x", x), ("r", rois), ("b", idx)], ["y"], 16, rtol=1e-4,
               atol=1e-5, coordinate_transformation_mode=ctm, output_height=2, output_width=3)
    _check("RoiAlign", [("x", x.astype(np.float64)), ("r", rois.astype(np.float64)),
                        ("b", idx)], ["y"], 16, output_height=2, output_width=3)


def test_grid_sample_other_dtypes():
    x = rng.standard_normal((1, 2, 4, 5))
    grid = rng.uniform(-1.1, 1.1, (1, 3, 3, 2))
    _check("GridSample", [("x", x), ("g", grid)], ["y"], 20)
    got = _run(_make_model("GridSample", [("x", x.astype(np.float16)),
                                          ("g", grid.astype(np.float16))], ["y"], 20),
               {"x": x.astype(np.float16), "g": grid.astype(np.float16)})[0]
    assert got.dtype == np.float16


def test_col2im_vs_ort():
    cols = rng.standard_normal((2, 3 * 2 * 3, 4 * 3)).astype(np.float32)
    _check("Col2Im", [("x", cols), ("s", np.array([5, 6], np.int64)),
                      ("k", np.array([2, 3], np.int64))], ["y"], 18, dilations=[2, 1],
           pads=[1, 0, 0, 1], strides=[1, 2])
    cols3 = rng.standard_normal((1, 2 * 8, 27)).astype(np.float32)
    _check("Col2Im", [("x", cols3), ("s", np.array([4, 4, 4], np.int64)),
                      ("k", np.array([2, 2, 2], np.int64))], ["y"], 18, oracle="reference")


@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("groups", [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_deform_conv_vs_ort(with_mask, groups):
    g, og = groups
    x = rng.standard_normal((2, 4, 7, 8)).astype(np.float32)
    w = rng.standard_normal((6, 4 // g, 3, 2)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    oh, ow = (7 + 2 - 2 * 2 - 1) // 1 + 1, (8 + 1 - 1 - 1) // 2 + 1
    off = rng.uniform(-2, 2, (2, og * 3 * 2 * 2, oh, ow)).astype(np.float32)
    mask = rng.uniform(0, 1, (2, og * 3 * 2, oh, ow)).astype(np.float32) if with_mask else None
    _check("DeformConv", [("x", x), ("w", w), ("o", off), ("b", b), ("m", mask)], ["y"], 19,
           rtol=1e-4, atol=1e-4, group=g, offset_group=og, dilations=[2, 1], pads=[1, 0, 1, 1],
           strides=[1, 2])


def test_center_crop_pad_vs_ort():
    x = rng.standard_normal((5, 6, 3)).astype(np.float32)
    _check("CenterCropPad", [("x", x), ("s", np.array([8, 3, 3], np.int64))], ["y"], 18)
    _check("CenterCropPad", [("x", x), ("s", np.array([2, 9], np.int64))], ["y"], 18,
           axes=[-3, 1])


def test_max_unpool_roundtrip_vs_ort():
    x = rng.standard_normal((2, 3, 6, 8)).astype(np.float32)
    pool = _make_model("MaxPool", [("x", x)], ["y", "i"], 12, kernel_shape=[2, 2],
                       strides=[2, 2])
    y, i = _run_ort(pool, {"x": x})
    _check("MaxUnpool", [("y", y), ("i", i)], ["z"], 11, kernel_shape=[2, 2], strides=[2, 2])
    # an output_shape equal to the inferred one agrees with onnxruntime
    _check("MaxUnpool", [("y", y), ("i", i), ("o", np.array(x.shape, np.int64))], ["z"], 11,
           kernel_shape=[2, 2], strides=[2, 2])


# -- image decoding ---------------------------------------------------------------------------


def _png(img: np.ndarray, filters) -> bytes:
    h, w, c = img.shape
    rows = []
    prev = np.zeros(w * c, np.int32)
    for y in range(h):
        f = filters[y % len(filters)]
        cur = img[y].reshape(-1).astype(np.int32)
        left = np.concatenate([np.zeros(c, np.int32), cur[:-c]])
        upleft = np.concatenate([np.zeros(c, np.int32), prev[:-c]])
        if f == 0:
            enc = cur
        elif f == 1:
            enc = cur - left
        elif f == 2:
            enc = cur - prev
        elif f == 3:
            enc = cur - (left + prev) // 2
        else:
            p = left + prev - upleft
            pa, pb, pc = abs(p - left), abs(p - prev), abs(p - upleft)
            pred = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, prev, upleft))
            enc = cur - pred
        rows.append(bytes([f]) + (enc & 255).astype(np.uint8).tobytes())
        prev = cur

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(
            ">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    ctype = {1: 0, 3: 2, 4: 6}[c]
    hdr = struct.pack(">IIBBBBB", w, h, 8, ctype, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", hdr)
            + chunk(b"IDAT", zlib.compress(b"".join(rows))) + chunk(b"IEND", b""))


def _decode(data: bytes, fmt="RGB"):
    arr = np.frombuffer(data, dtype=np.uint8).copy()
    return _run(_make_model("ImageDecoder", [("d", arr)], ["y"], 20, pixel_format=fmt),
                {"d": arr})[0]


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_png_all_filters(channels):
    img = rng.integers(0, 256, (9, 11, channels)).astype(np.uint8)
    got = _decode(_png(img, [0, 1, 2, 3, 4]))
    want = np.repeat(img, 3, 2) if channels == 1 else img[..., :3]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(_decode(_png(img, [4, 3]), "BGR"), want[..., ::-1])


def test_bmp_pnm_decoders():
    img = rng.integers(0, 256, (5, 7, 3)).astype(np.uint8)
    stride = (7 * 3 + 3) // 4 * 4
    rows = b"".join(img[y, :, ::-1].tobytes().ljust(stride, b"\0") for y in range(4, -1, -1))
    bmp = (b"BM" + struct.pack("<IHHI", 54 + len(rows), 0, 0, 54)
           + struct.pack("<IiiHHIIiiII", 40, 7, 5, 1, 24, 0, len(rows), 0, 0, 0, 0) + rows)
    np.testing.assert_array_equal(_decode(bmp), img)
    ppm = b"P6\n# comment\n7 5\n255\n" + img.tobytes()
    np.testing.assert_array_equal(_decode(ppm), img)
    gray = _decode(b"P2 3 1 15 0 7 15", "Grayscale")
    np.testing.assert_array_equal(gray[..., 0], [[0, 119, 255]])


def _lzw(data: bytes) -> bytes:
    """TIFF (libtiff) LZW encoder: MSB-first codes, 9-12 bits, clear at 4093 entries."""
    table = {bytes([i]): i for i in range(256)}
    next_code, width, bits, w = 258, 9, [], b""

    def emit(code):
        bits.append(format(code, f"0{width}b"))

    emit(256)
    for byte in data:
        wc = w + bytes([byte])
        if wc in table:
            w = wc
            continue
        emit(table[w])
        table[wc] = next_code
        next_code += 1
        if next_code > (1 << width) - 1 and width < 12:
            width += 1
        if next_code >= 4093:
            emit(256)
            table = {bytes([i]): i for i in range(256)}
            next_code, width = 258, 9
        w = bytes([byte])
    emit(table[w])
    emit(257)
    text = "".join(bits)
    text += "0" * (-len(text) % 8)
    return int(text, 2).to_bytes(len(text) // 8, "big")


def _packbits(data: bytes) -> bytes:
    out = bytearray()
    for i in range(0, len(data), 64):  # literal runs only, plus one repeat run
        chunk = data[i:i + 64]
        out += bytes([len(chunk) - 1]) + chunk
    return bytes(out) + bytes([256 - 3, 7])  # a repeat run (4 x byte 7) past the image end


def _tiff(img: np.ndarray, compression: int, predictor: int = 1) -> bytes:
    h, w, _ = img.shape
    raw = img.astype(np.int32)
    if predictor == 2:
        raw = np.concatenate([raw[:, :1], np.diff(raw, axis=1)], axis=1) & 255
    body = raw.astype(np.uint8).tobytes()
    if compression == 5:
        body = _lzw(body)
    elif compression == 32773:
        body = _packbits(body)
    tags = [(256, 4, w), (257, 4, h), (258, 3, 8), (259, 3, compression), (262, 3, 2),
            (273, 4, 8), (277, 3, 3), (278, 4, h), (279, 4, len(body)), (317, 3, predictor)]
    ifd = struct.pack("<H", len(tags))
    for tag, typ, val in tags:
        count = 3 if tag == 258 else 1
        if tag == 258:  # three shorts do not fit: point to them after the IFD
            off = 8 + len(body) + 2 + 12 * len(tags) + 4
            ifd += struct.pack("<HHII", tag, typ, count, off)
        else:
            ifd += struct.pack("<HHI", tag, typ, count) + struct.pack(
                "<I" if typ == 4 else "<HH", *((val,) if typ == 4 else (val, 0)))
    ifd += struct.pack("<I", 0) + struct.pack("<HHH", 8, 8, 8)
    return b"II*\x00" + struct.pack("<I", 8 + len(body)) + body + ifd


@pytest.mark.parametrize("compression,predictor", [(1, 1), (5, 1), (5, 2), (32773, 1)])
def test_tiff_decoder(compression, predictor):
    img = (rng.integers(0, 4, (13, 17, 3)) * 60).astype(np.uint8)
    data = _tiff(img, compression, predictor)
    np.testing.assert_array_equal(_decode(data), img)
    big = np.repeat(np.repeat(img, 9, 0), 9, 1)  # long enough to reach 12-bit codes
    np.testing.assert_array_equal(_decode(_tiff(big, 5, predictor)), big)


def _pillow_encoded(img: np.ndarray, fmt: str, **params) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img).save(buf, fmt, **params)
    return buf.getvalue()


@pytest.mark.parametrize("params", [{"lossless": True}, {"quality": 80}])
def test_webp(params):
    """WebP, lossless and lossy (onnxruntime has no ImageDecoder): Pillow's own decode, with
    the operator's pixel formats (Grayscale: Pillow's luma of the RGB image)."""
    from PIL import Image

    img = rng.integers(0, 256, (21, 34, 3)).astype(np.uint8)
    data = _pillow_encoded(img, "WEBP", **params)
    want = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    if params.get("lossless"):
        np.testing.assert_array_equal(want, img)
    np.testing.assert_array_equal(_decode(data), want)
    np.testing.assert_array_equal(_decode(data, "BGR"), want[:, :, ::-1])
    gray = _decode(data, "Grayscale")
    assert gray.shape == (21, 34, 1)
    c = want.astype(np.uint32)  # ITU-R 601-2 luma in Pillow's fixed point
    luma = (c[..., 0] * 19595 + c[..., 1] * 38470 + c[..., 2] * 7471 + 0x8000) >> 16
    np.testing.assert_array_equal(gray[..., 0], luma)


def test_sixteen_bit_png_keeps_the_high_byte():
    from PIL import Image

    img = (np.arange(35, dtype=np.uint16).reshape(5, 7) * 1873).astype(np.uint16)
    data = _pillow_encoded(img, "PNG")
    assert Image.open(io.BytesIO(data)).mode.startswith("I")  # 16-bit gray on Pillow's side
    np.testing.assert_array_equal(_decode(data), np.repeat((img >> 8)[..., None], 3, 2))
    np.testing.assert_array_equal(_decode(data, "Grayscale")[..., 0], img >> 8)


def test_image_decoder_refuses_bad_data_and_other_formats():
    img = rng.integers(0, 256, (6, 5, 3)).astype(np.uint8)
    png = _pillow_encoded(img, "PNG")
    with pytest.raises(OnnxRunError, match="not an image in a supported format"):
        _decode(b"not an image at all")
    # GIF decodes in Pillow, but is not a format of the operator's specification
    with pytest.raises(OnnxRunError, match="not an image in a supported format"):
        _decode(_pillow_encoded(img, "GIF"))
    with pytest.raises(OnnxRunError, match="cannot decode the image"):
        _decode(png[: len(png) // 2])  # truncated
    np.testing.assert_array_equal(_decode(png), img)


def test_image_decoder_without_pillow_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL", None)  # makes the import fail
    with pytest.raises(OnnxRunError, match="pip install pillow") as info:
        _decode(_png(rng.integers(0, 256, (2, 2, 3)).astype(np.uint8), [0]))
    assert "ImageDecoder" in str(info.value)


# -- text -------------------------------------------------------------------------------------


def _strings(values, shape=None):
    a = np.array(values, dtype=object)
    return a.reshape(shape) if shape else a


@pytest.mark.parametrize("action", ["NONE", "LOWER", "UPPER"])
@pytest.mark.parametrize("sensitive", [0, 1])
def test_string_normalizer_vs_ort(action, sensitive):
    # onnxruntime's default locale (en_US.UTF-8) may be missing; C.UTF-8 has the same rules
    x = _strings(["Monday", "tuesday", "MONDAY", "Été", "x y", "stop"])
    for locale in ("C.UTF-8", "C"):
        _check("StringNormalizer", [("x", x)], ["y"], 10, case_change_action=action,
               is_case_sensitive=sensitive, stopwords=["monday", "stop"], locale=locale)
    _check("StringNormalizer", [("x", x.reshape(1, -1))], ["y"], 10, locale="C.UTF-8",
           case_change_action=action, is_case_sensitive=sensitive)
    _check("StringNormalizer", [("x", _strings(["a", "A"]))], ["y"], 10, locale="C.UTF-8",
           case_change_action=action, stopwords=["a"])


def test_string_concat_split_regex_vs_ort():
    a = _strings(["ab", "c d", ""], (3, 1))
    b = _strings(["x", "yz"], (1, 2))
    _check("StringConcat", [("a", a), ("b", b)], ["y"], 20)
    x = _strings(["a,b,,c", "", "d", ",e"], (2, 2))
    _check("StringSplit", [("x", x)], ["y", "z"], 20, delimiter=",")
    _check("StringSplit", [("x", x)], ["y", "z"], 20, delimiter=",", maxsplit=1)
    spaced = _strings([" a  b ", "c", "  ", "a b c d", "  b  c ", "x  y   ", ""])
    _check("StringSplit", [("x", spaced)], ["y", "z"], 20)
    for limit in (1, 2):
        _check("StringSplit", [("x", spaced)], ["y", "z"], 20, maxsplit=limit)
        _check("StringSplit", [("x", x)], ["y", "z"], 20, delimiter=",,", maxsplit=limit)
    words = _strings(["abc@x.org", "a.b@y.com", "nope", "ABC", "", "a1_"])
    for pattern in [r"[a-z.]+@[a-z]+\.(org|com)", r"[[:alpha:]]+", r"\w+", r"a.*"]:
        _check("RegexFullMatch", [("x", words)], ["y"], 20, pattern=pattern)


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
@pytest.mark.parametrize("skip", [0, 2])
@pytest.mark.parametrize("grams", [(1, 1), (1, 3), (2, 3)])
def test_tfidf_vs_ort(mode, skip, grams):
    lo, hi = grams
    pool = [2, 3, 5, 4, 5, 6, 7, 8, 6, 7, 2, 3, 4, 7, 8, 9]  # 4 unigrams, 3 bigrams, 2 trigrams
    counts = [0, 4, 10]
    idx = list(range(9))
    w = rng.uniform(0.5, 2, 9).astype(np.float32).tolist()
    x = rng.integers(2, 10, (3, 12)).astype(np.int64)
    attrs = dict(mode=mode, min_gram_length=lo, max_gram_length=hi, max_skip_count=skip,
                 ngram_counts=counts, ngram_indexes=idx, pool_int64s=pool, weights=w)
    _check("TfIdfVectorizer", [("x", x)], ["y"], 9, **attrs)
    _check("TfIdfVectorizer", [("x", x[0].astype(np.int32))], ["y"], 9, **attrs)
    strs = np.array([str(v) for v in x.reshape(-1)], dtype=object).reshape(x.shape)
    attrs.pop("pool_int64s")
    _check("TfIdfVectorizer", [("x", strs)], ["y"], 9, pool_strings=[str(p) for p in pool],
           **attrs)


# -- math -------------------------------------------------------------------------------------


def test_det_vs_ort():
    x = rng.standard_normal((3, 2, 4, 4)).astype(np.float32)
    _check("Det", [("x", x)], ["y"], 21, rtol=1e-4, atol=1e-5)
    # onnxruntime has no double Det
    _check("Det", [("x", x[0, 0].astype(np.float64))], ["y"], 22, oracle="reference")
    half = x.astype(np.float16)
    got = _run(_make_model("Det", [("x", half)], ["y"], 22), {"x": half})[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got, np.linalg.det(half.astype(np.float32)), rtol=1e-2,
                               atol=1e-2)


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cumprod_vs_ort(exclusive, reverse):
    x = rng.uniform(0.5, 1.5, (3, 4, 5)).astype(np.float32)
    for axis in (0, 1, -1):
        _check("CumProd", [("x", x), ("a", np.array(axis, np.int64))], ["y"], 26,
               exclusive=exclusive, reverse=reverse)
    xi = rng.integers(-3, 4, (4, 5)).astype(np.int64)
    _check("CumProd", [("x", xi), ("a", np.array(1, np.int32))], ["y"], 26,
           exclusive=exclusive, reverse=reverse)


def test_bitcast_and_swish_vs_ort():
    x = rng.standard_normal((3, 4)).astype(np.float32)
    _check("BitCast", [("x", x)], ["y"], 26, to=TensorProto.UINT32)
    _check("BitCast", [("x", x.astype(np.float16))], ["y"], 26, to=TensorProto.INT16)
    _check("BitCast", [("x", x.astype(np.float64))], ["y"], 26, to=TensorProto.INT64)
    _check("Swish", [("x", x * 30)], ["y"], 24, alpha=0.7)
    model = _make_model("BitCast", [("x", x)], ["y"], 26, to=TensorProto.INT64)
    with pytest.raises(OnnxRunError):  # rejected at load (shape inference) or at run
        _run(model, {"x": x})


# -- training ---------------------------------------------------------------------------------

_TRAIN = "ai.onnx.preview.training"


def test_training_ops_vs_reference():
    r = np.array(0.1, np.float32)
    t = np.array(3, np.int64)
    xs = [rng.standard_normal((3, 2)).astype(np.float32) for _ in range(8)]
    pos = [np.abs(a) for a in xs]
    _check("Adagrad", [("r", r), ("t", t), ("x1", xs[0]), ("x2", xs[1]), ("g1", xs[2]),
                       ("g2", xs[3]), ("h1", pos[4]), ("h2", pos[5])],
           ["x1n", "x2n", "h1n", "h2n"], 17, domain=_TRAIN, oracle="reference",
           check_dtype=False, decay_factor=0.1, epsilon=1e-5, norm_coefficient=0.01)
    _check("Adam", [("r", r), ("t", t), ("x", xs[0]), ("g", xs[1]), ("v", xs[2]),
                    ("h", pos[3])], ["xn", "vn", "hn"], 17, domain=_TRAIN,
           oracle="reference", check_dtype=False, alpha=0.85, beta=0.95, epsilon=1e-4,
           norm_coefficient=0.01, norm_coefficient_post=0.02)
    for mode in ("standard", "nesterov"):
        for step in (0, 4):
            _check("Momentum", [("r", r), ("t", np.array(step, np.int64)), ("x", xs[0]),
                                ("g", xs[1]), ("v", xs[2])], ["xn", "vn"], 17, domain=_TRAIN,
                   oracle="reference", check_dtype=False, alpha=0.9, beta=0.5, mode=mode,
                   norm_coefficient=0.01)


# -- random -----------------------------------------------------------------------------------


def test_random_ops_shape_dtype_stats():
    m = _make_model("RandomNormal", [], ["y"], 22, shape=[200, 50], mean=2.0, scale=0.5,
                    dtype=TensorProto.DOUBLE)
    y = _run(m, {})[0]
    assert y.shape == (200, 50) and y.dtype == np.float64
    assert abs(y.mean() - 2.0) < 0.05 and abs(y.std() - 0.5) < 0.05
    m = _make_model("RandomUniform", [], ["y"], 22, shape=[1000], low=-3.0, high=-1.0)
    y = _run(m, {})[0]
    assert y.dtype == np.float32 and y.min() >= -3 and y.max() < -1
    like = np.zeros((4, 5), np.float16)
    y = _run(_make_model("RandomUniformLike", [("x", like)], ["y"], 22), {"x": like})[0]
    assert y.shape == (4, 5) and y.dtype == np.float16
    y = _run(_make_model("RandomNormalLike", [("x", like)], ["y"], 22,
                         dtype=TensorProto.FLOAT), {"x": like})[0]
    assert y.dtype == np.float32
    p = np.array([0.0, 1.0, 0.5] * 1000, np.float32)
    y = _run(_make_model("Bernoulli", [("p", p)], ["y"], 22, dtype=TensorProto.INT32),
             {"p": p})[0]
    assert y.dtype == np.int32 and (y[0::3] == 0).all() and (y[1::3] == 1).all()
    assert 0.4 < y[2::3].mean() < 0.6
    logits = np.log(np.array([[0.7, 0.2, 0.1, 0.0]], np.float32) + 1e-30)
    y = _run(_make_model("Multinomial", [("x", logits)], ["y"], 22, sample_size=4000,
                         dtype=TensorProto.INT64), {"x": logits})[0]
    assert y.shape == (1, 4000) and y.dtype == np.int64
    freq = np.bincount(y[0], minlength=4) / 4000
    np.testing.assert_allclose(freq, [0.7, 0.2, 0.1, 0.0], atol=0.03)


def test_random_seeded_is_reproducible_per_session():
    m = _make_model("RandomNormal", [], ["y"], 22, shape=[5], seed=3.0).SerializeToString()
    a = onnxrun.InferenceSession(m)
    b = onnxrun.InferenceSession(m)
    first = a.run(None, {})[0]
    np.testing.assert_array_equal(first, b.run(None, {})[0])
    # like onnxruntime, successive runs continue the node's stream
    assert not np.array_equal(first, a.run(None, {})[0])


# -- vectorization sanity (work done in Python does not grow with the input) ------------------


def _python_calls(model, feeds) -> int:
    """Python and C function calls made by one run (after a first one): a deterministic
    measure of per-element Python loops, where a timed run would make the test flaky."""
    import sys

    sess = onnxrun.InferenceSession(model.SerializeToString())
    # two runs first: the first imports the kernel's module, after which the next run's
    # thread settings scan the loaded libraries again (threadpoolctl: hundreds of calls)
    sess.run(None, feeds)
    sess.run(None, feeds)
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        calls += event in ("call", "c_call")

    sys.setprofile(count)
    try:
        sess.run(None, feeds)
    finally:
        sys.setprofile(None)
    return calls


def test_large_inputs_stay_vectorized():
    def grid_sample(k):
        x = rng.standard_normal((2, 8, 48, 48)).astype(np.float32)
        grid = rng.uniform(-1, 1, (2, 64 * k, 64, 2)).astype(np.float32)
        return _make_model("GridSample", [("x", x), ("g", grid)], ["y"], 20,
                           mode="cubic"), {"x": x, "g": grid}

    def roi_align(k):
        x = rng.standard_normal((2, 8, 48, 48)).astype(np.float32)
        rois, idx = _rois(100 * k, 48, 48), rng.integers(0, 2, 100 * k).astype(np.int64)
        return _make_model("RoiAlign", [("x", x), ("r", rois), ("b", idx)], ["y"], 16,
                           output_height=7, output_width=7, sampling_ratio=2), \
            {"x": x, "r": rois, "b": idx}

    def nms(k):
        boxes = np.concatenate([rng.uniform(0, 100, (1, 3000 * k, 2)),
                                rng.uniform(0, 100, (1, 3000 * k, 2)) + 5], -1)
        feeds = {"b": boxes.astype(np.float32),
                 "s": rng.uniform(0, 1, (1, 2, 3000 * k)).astype(np.float32),
                 "m": np.array([200], np.int64), "i": np.array([0.5], np.float32)}
        return _make_model("NonMaxSuppression", list(feeds.items()), ["y"], 11), feeds

    # GridSample: 4x the sampled points: not one call more. NonMaxSuppression: 4x the boxes
    # (at most 200 kept per class either way): a call or two per box kept, whose number
    # depends on the random boxes (199 or 200 of a class), where a loop over the boxes
    # would add thousands.
    assert _python_calls(*grid_sample(4)) == _python_calls(*grid_sample(1))
    assert abs(_python_calls(*nms(4)) - _python_calls(*nms(1))) <= 8
    # RoiAlign loops over the regions, as onnxruntime does, but not over a region's 7x7 bins
    # or its 2x2 samples per bin: fewer calls per added region than it has bins.
    added = _python_calls(*roi_align(4)) - _python_calls(*roi_align(1))
    assert added < 300 * 49
