"""float32 GroupQueryAttention: onnxruntime 1.32's numbers bit for bit (compiled/gqa.py: its
flash path, the decode GEMV kernel for one new token, the tiled kernel for a prompt, MLAS's
rope, SGEMM and exp), onnxruntime as the oracle: prompts and decode steps, packed and
separate Q/K/V, rotary inside (plain and interleaved) or none, several head counts, kv heads
and head sizes 32-128, lengths that are not multiples of 8 or 16, prompts longer than one KV
block and whose last query block holds one row, a local window, batches, the shared
past/present buffer."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper
from ort_bits import assert_ort_bits

import onnxrun
from onnxrun.providers.cpu.compiled import gqa, spin
from onnxrun.providers.cpu.ops.contrib.transformer import SHARE_PAST_PRESENT

ort = pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.skipif(gqa.unavailable() is not None,
                                reason=f"compiled kernel: {gqa.unavailable()}")

MAX_POS = 2048


def _model(N: int, Nkv: int, H: int, rotary: bool, interleaved: bool, window: int,
           packed: bool) -> bytes:
    D = (N + 2 * Nkv) * H if packed else N * H
    inputs = [helper.make_tensor_value_info("query", TP.FLOAT, ["B", "S", D])]
    names = ["query", "", ""]
    if not packed:
        inputs += [helper.make_tensor_value_info(n, TP.FLOAT, ["B", "S", Nkv * H])
                   for n in ("key", "value")]
        names[1:] = ["key", "value"]
    inputs += [helper.make_tensor_value_info(n, TP.FLOAT, ["B", Nkv, "P", H])
               for n in ("past_key", "past_value")]
    inputs += [helper.make_tensor_value_info("seqlens_k", TP.INT32, ["B"]),
               helper.make_tensor_value_info("total_sequence_length", TP.INT32, [])]
    names += ["past_key", "past_value", "seqlens_k", "total_sequence_length"]
    attrs = dict(num_heads=N, kv_num_heads=Nkv, local_window_size=window)
    if rotary:
        inputs += [helper.make_tensor_value_info(n, TP.FLOAT, [MAX_POS, H // 2])
                   for n in ("cos_cache", "sin_cache")]
        names += ["cos_cache", "sin_cache"]
        attrs.update(do_rotary=1, rotary_interleaved=int(interleaved))
    node = helper.make_node("GroupQueryAttention", names, ["out", "present_key",
                                                           "present_value"],
                            domain="com.microsoft", **attrs)
    outputs = [helper.make_tensor_value_info(n, TP.FLOAT, None)
               for n in ("out", "present_key", "present_value")]
    graph = helper.make_graph([node], "gqa", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)]
                             ).SerializeToString()


def _caches(H: int) -> dict:
    inv = 1.0 / (10000 ** (np.arange(0, H, 2) / H))
    angles = np.arange(MAX_POS)[:, None] * inv[None]
    return {"cos_cache": np.cos(angles).astype(np.float32),
            "sin_cache": np.sin(angles).astype(np.float32)}


def _sessions(data: bytes, share: bool, threads: int = 1):
    so = onnxrun.SessionOptions()
    so.intra_op_num_threads = threads
    if share:
        so.add_session_config_entry(SHARE_PAST_PRESENT, "1")
    ours = onnxrun.InferenceSession(data, so)
    ort_so = ort.SessionOptions()
    ort_so.intra_op_num_threads = threads
    theirs = ort.InferenceSession(data, ort_so, providers=["CPUExecutionProvider"])
    return ours, theirs


def _assert_same(got, want):
    for g, w, name in zip(got, want, ("output", "present_key", "present_value"), strict=True):
        assert_ort_bits(g, w, err=name)


CASES = [  # N, Nkv, H, batch, prompt, decode steps, rotary, interleaved, window, packed
    (14, 2, 64, 1, 37, 3, True, False, -1, True),  # Qwen2-0.5B's attention
    (14, 2, 64, 1, 300, 1, True, False, -1, True),  # two KV blocks
    (14, 2, 64, 1, 129, 1, True, False, -1, True),  # last query block of one row
    (4, 2, 128, 1, 150, 2, True, False, -1, True),  # head size 128: KV blocks of 128
    (4, 2, 96, 1, 19, 2, True, False, -1, True),  # Phi-3's 96: 1 / sqrt(96) in float32
    (8, 8, 64, 1, 13, 2, False, False, -1, True),  # no rotary, as many kv heads as heads
    (6, 3, 32, 1, 70, 2, True, True, -1, False),  # interleaved rotary, separate Q/K/V
    (4, 1, 64, 2, 11, 2, True, False, -1, True),  # a batch
    (4, 2, 64, 1, 23, 3, True, False, 8, True),  # local window
    (4, 2, 64, 1, 1, 2, True, False, -1, True),  # one-token prompt
]


# onnxruntime refuses a batch's prompt into a past buffer (batch_size must be 1 when
# sequence_length > 1 and past context is given): batches without the shared buffer
@pytest.mark.parametrize("N,Nkv,H,B,S,steps,rotary,interleaved,window,packed,share",
                         [(*c, share) for c in CASES for share in (False, True)
                          if not (share and c[3] > 1)])
def test_prompt_then_decode_bit_exact(N, Nkv, H, B, S, steps, rotary, interleaved, window,
                                      packed, share):
    data = _model(N, Nkv, H, rotary, interleaved, window, packed)
    ours, theirs = _sessions(data, share)
    rng = np.random.default_rng(N * 1000 + S)
    caches = _caches(H) if rotary else {}
    # a max_length buffer with share (genai's past_present_share_buffer), else a growing one
    P = S + steps + 5 if share else 0
    past_k = np.zeros((B, Nkv, P, H), np.float32)
    state = {"ours": (past_k, past_k.copy()), "theirs": (past_k.copy(), past_k.copy())}
    total = 0
    for step, n in enumerate([S] + [1] * steps):
        total += n
        D = (N + 2 * Nkv) * H if packed else N * H
        feed = {"query": (rng.standard_normal((B, n, D)) * 2).astype(np.float32),
                "seqlens_k": np.full(B, total - 1, np.int32),
                "total_sequence_length": np.array(max(total, P), np.int32), **caches}
        if not packed:
            feed["key"] = (rng.standard_normal((B, n, Nkv * H)) * 2).astype(np.float32)
            feed["value"] = rng.standard_normal((B, n, Nkv * H)).astype(np.float32)
        if share and step == 0:
            feed["total_sequence_length"] = np.array(P, np.int32)
        got = ours.run(None, {**feed, "past_key": state["ours"][0],
                              "past_value": state["ours"][1]})
        want = theirs.run(None, {**feed, "past_key": state["theirs"][0],
                                 "past_value": state["theirs"][1]})
        _assert_same(got, want)
        state = {"ours": (got[1], got[2]), "theirs": (want[1], want[2])}


TWO_THREAD_CASES = [  # as CASES, run with intra_op_num_threads=2 on both engines
    (14, 2, 64, 1, 300, 2, True, False, -1, True),  # Qwen2-0.5B: a kv head per thread
    (4, 1, 64, 1, 129, 2, True, False, -1, True),  # one kv head: its rows split, one-row block
    (4, 1, 64, 1, 300, 1, True, False, 100, True),  # the same over two KV blocks, a window
    (6, 3, 32, 1, 70, 2, True, True, -1, False),  # three kv heads, separate Q/K/V
    (4, 1, 64, 2, 40, 2, True, False, -1, True),  # a batch
]


def _split_calls(monkeypatch) -> list:
    """(blocks, threads) of every spin.run_blocks call the GQA kernels make, and (parts,
    parts) of every Pool.fork they make themselves (a decode step's heads)."""
    calls = []
    real, fork = spin.run_blocks, spin.Pool.fork
    monkeypatch.setattr(spin, "run_blocks",
                        lambda job, blocks, threads: calls.append((len(blocks), threads))
                        or real(job, blocks, threads))
    monkeypatch.setattr(spin.Pool, "fork", lambda pool, job, argv, at=0: calls.append(
        (len(argv), len(argv))) or fork(pool, job, argv, at))
    return calls


def test_decode_heads_taken_in_turn():
    """decode_grab: every thread of a split runs it on one block and takes the next head
    from its counter, so a thread that comes late (here: the same thread again, after all
    heads are done) finds nothing left; the heads' numbers are decode's over all of them."""
    from onnxrun.providers.cpu.compiled.jit import address

    fn = gqa.kernels()
    rng = np.random.default_rng(7)
    N, Nkv, H, T = 6, 2, 32, 50
    q = rng.standard_normal((N, H)).astype(np.float32)
    k = rng.standard_normal((Nkv, T, H)).astype(np.float32)
    v = rng.standard_normal((Nkv, T, H)).astype(np.float32)
    want, got = np.empty((N, H), np.float32), np.full((N, H), np.nan, np.float32)
    sc = np.empty((N, T), np.float32)
    fn.decode(address(q), address(k), address(v), address(want), address(sc), 0, N, N // Nkv,
              T, H, T * H, T * H, 0.25, 3, 0, None)
    block = np.array([address(q), address(k), address(v), address(got), address(sc), 0, N,
                      N // Nkv, T, H, T * H, T * H, gqa._word(0.25), 3, 0, 0, 0,
                      sc.strides[0]], np.int64)
    for _ in range(2):
        fn.decode_grab(address(block))
    assert got.tobytes() == want.tobytes()
    assert block[16] == N + 2  # each head taken once, then one look each that found none


@pytest.mark.parametrize("rotary,interleaved,window,H", [
    (True, False, -1, 32), (True, True, 5, 64), (False, False, -1, 32), (True, False, 40, 16)])
def test_decode_step_one_call(rotary, interleaved, window, H):
    """decode_step: the packed row copied, rope_rows on its q and k heads at the position, the
    k and v heads written at row total - 1 of each kv head of the caches (heads sk floats
    apart), decode over total keys: the same bits as those calls one by one, the rest of the
    caches and the input row untouched."""
    from onnxrun.providers.cpu.compiled.jit import address

    fn = gqa.kernels()
    rng = np.random.default_rng(5)
    N, Nkv, P, total, pos = 8, 2, 37, 30, 52
    half = H // 2 if rotary else 0
    cos = rng.standard_normal((64, H // 2)).astype(np.float32)
    sin = rng.standard_normal((64, H // 2)).astype(np.float32)
    row = rng.standard_normal((N + 2 * Nkv) * H).astype(np.float32)
    caches = [rng.standard_normal((1, Nkv, P, H)).astype(np.float32) for _ in range(2)]
    # one by one, as _decode_step called them
    x = row.reshape(N + 2 * Nkv, H).copy()
    if rotary:
        fn.rope_rows(address(x), N + Nkv, H, address(cos) + pos * 4 * half,
                     address(sin) + pos * 4 * half, half, int(interleaved), 1)
    k_want, v_want = (c.copy() for c in caches)
    k_want[0, :, total - 1] = x[N:N + Nkv]
    v_want[0, :, total - 1] = x[N + Nkv:]
    want = np.empty(N * H, np.float32)
    ws = total - window if 0 <= window < total else 0
    gqa.decode_heads(fn, address(x), address(k_want), address(v_want), address(want), N,
                     N // Nkv, total, H, P * H, P * H, 0.125, ws)
    block = np.array([N, Nkv, H, gqa._word(0.125), window, address(cos) if rotary else 0,
                      address(sin) if rotary else 0, half, int(interleaved), int(rotary)],
                     np.int64)
    assert len(block) == len(gqa.STEP_WORDS)
    before = row.copy()
    got = np.full(N * H, np.nan, np.float32)
    fn.decode_step(address(row), address(got), address(caches[0]), address(caches[1]),
                   address(block), pos, total, P * H)
    assert got.tobytes() == want.tobytes()
    assert caches[0].tobytes() == k_want.tobytes() and caches[1].tobytes() == v_want.tobytes()
    assert row.tobytes() == before.tobytes()


@pytest.mark.parametrize("N,Nkv,H,B,S,steps,rotary,interleaved,window,packed,share",
                         [(*c, share) for c in TWO_THREAD_CASES for share in (False, True)
                          if not (share and c[3] > 1)])
def test_two_threads_bit_exact(N, Nkv, H, B, S, steps, rotary, interleaved, window, packed,
                               share, monkeypatch):
    """Prompts and decode steps on two threads: the prompt's query rows and a step's heads
    split over the spinning workers, the numbers onnxruntime's at 2 threads."""
    calls = _split_calls(monkeypatch)
    data = _model(N, Nkv, H, rotary, interleaved, window, packed)
    ours, theirs = _sessions(data, share, threads=2)
    rng = np.random.default_rng(N * 1000 + S + 7)
    caches = _caches(H) if rotary else {}
    P = S + steps + 5 if share else 0
    past_k = np.zeros((B, Nkv, P, H), np.float32)
    state = {"ours": (past_k, past_k.copy()), "theirs": (past_k.copy(), past_k.copy())}
    total = 0
    for n in [S] + [1] * steps:
        total += n
        D = (N + 2 * Nkv) * H if packed else N * H
        feed = {"query": (rng.standard_normal((B, n, D)) * 2).astype(np.float32),
                "seqlens_k": np.full(B, total - 1, np.int32),
                "total_sequence_length": np.array(max(total, P), np.int32), **caches}
        if not packed:
            feed["key"] = (rng.standard_normal((B, n, Nkv * H)) * 2).astype(np.float32)
            feed["value"] = rng.standard_normal((B, n, Nkv * H)).astype(np.float32)
        got = ours.run(None, {**feed, "past_key": state["ours"][0],
                              "past_value": state["ours"][1]})
        want = theirs.run(None, {**feed, "past_key": state["theirs"][0],
                                 "past_value": state["theirs"][1]})
        _assert_same(got, want)
        state = {"ours": (got[1], got[2]), "theirs": (want[1], want[2])}
    if spin.usable() is not None:  # the prompt went to two threads in parts
        assert any(n > 1 and t == 2 for n, t in calls)


@pytest.mark.parametrize("N,Nkv,past,window,share", [
    (14, 2, 300, -1, False), (14, 2, 1000, -1, False), (14, 2, 2000, -1, False),
    (14, 2, 1000, 500, False), (14, 2, 300, -1, True), (14, 2, 2000, -1, True),
    (1, 1, 300, -1, False), (1, 1, 2000, -1, False), (1, 1, 2000, 700, False),  # key blocks
    (3, 1, 1000, -1, False), (3, 1, 1000, 300, True)])
def test_two_threads_long_cache_decode_bit_exact(N, Nkv, past, window, share, monkeypatch):
    """One new token over a long cache on two threads: heads split (heads >= threads; with
    the shared buffer, onnxrun.genai's decode step) or, with fewer heads than threads, the
    keys in KV blocks (flash decoding) as onnxruntime does at 2 threads, each block's task
    on either thread."""
    calls = _split_calls(monkeypatch)
    H = 64
    data = _model(N, Nkv, H, True, False, window, True)
    ours, theirs = _sessions(data, share, threads=2)
    rng = np.random.default_rng(past + N)
    P = past + 1 if share else past  # a shared buffer holds the new row too
    cache = [(rng.standard_normal((1, Nkv, P, H)) * s).astype(np.float32) for s in (2, 1)]
    feed = {"query": (rng.standard_normal((1, 1, (N + 2 * Nkv) * H)) * 2).astype(np.float32),
            "seqlens_k": np.array([past], np.int32),
            "total_sequence_length": np.array(past + 1, np.int32), **_caches(H)}
    want = theirs.run(None, {**feed, "past_key": cache[0].copy(), "past_value": cache[1].copy()})
    got = ours.run(None, {**feed, "past_key": cache[0], "past_value": cache[1]})
    _assert_same(got, want)
    if spin.usable() is not None:
        # with fewer heads than threads, the keys split only where they fill more than one
        # KV block, whose size comes from this host's L2 cache as onnxruntime's does (one
        # MiB of L2: 512 keys of 64, so 301 keys stay whole, and so do onnxruntime's)
        blocks = -(-(past + 1) // max(gqa.l2_cache_size() // (32 * H), 1))
        split = any(n > 1 and t == 2 for n, t in calls)
        assert split == (N >= 2 or blocks > 1), (calls, blocks)


@pytest.mark.parametrize("window", [-1, 200])
def test_flash_decoding_split_bit_exact(window):
    """One new token with batch x heads under the thread count and more than one KV block:
    onnxruntime splits the keys in blocks (flash decoding) and combines the blocks' results
    (expf rescaling); the same session thread count here takes the same order."""
    N, Nkv, H, past = 2, 1, 64, 300  # 301 keys: two blocks of 256 (L2 512 KiB)
    data = _model(N, Nkv, H, True, False, window, True)
    ours, theirs = _sessions(data, False, threads=4)
    rng = np.random.default_rng(7)
    feed = {"query": (rng.standard_normal((1, 1, (N + 2 * Nkv) * H)) * 2).astype(np.float32),
            "past_key": rng.standard_normal((1, Nkv, past, H)).astype(np.float32),
            "past_value": rng.standard_normal((1, Nkv, past, H)).astype(np.float32),
            "seqlens_k": np.array([past], np.int32),
            "total_sequence_length": np.array(past + 1, np.int32), **_caches(H)}
    _assert_same(ours.run(None, feed), theirs.run(None, feed))


def test_mlas_stride_k():
    # MlasSgemmOperation's K strides: the N stride doubles while K fits half the K stride,
    # else the K stride doubles while N fits half the N stride
    assert gqa.mlas_stride_k(300, 64) == 64
    assert gqa.mlas_stride_k(300, 256) == 128
    assert gqa.mlas_stride_k(64, 300) == 256
    assert gqa.mlas_stride_k(128, 300) == 128
    assert gqa.mlas_stride_k(32, 1000) == 512


def test_small_blocks_match_the_reference_order():
    """The tiled kernel with small L2-derived blocks (several KV blocks and query blocks,
    online rescaling with the C library's expf) stays within float tolerance of plain
    attention: the block logic itself, apart from the oracle's machine."""
    rng = np.random.default_rng(3)
    N, Nkv, H, S = 4, 2, 32, 45
    q = rng.standard_normal((N, S, H)).astype(np.float32)
    k = rng.standard_normal((Nkv, S, H)).astype(np.float32)
    v = rng.standard_normal((Nkv, S, H)).astype(np.float32)
    got = gqa.attend(q, k, v, 0, S, 1 / np.sqrt(H), l2=4 * 4 * 2 * H * 16)  # blocks of 16
    kk, vv = np.repeat(k, N // Nkv, 0), np.repeat(v, N // Nkv, 0)
    scores = np.einsum("nsh,nth->nst", q, kk) / np.sqrt(H)
    scores[:, np.triu(np.ones((S, S), bool), 1)] = -np.inf
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    want = np.einsum("nst,nth->snh", probs, vv).reshape(S, N * H)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_prompt_writes_into_out_from_reused_scratch():
    """A prompt's result goes straight into the caller's ``out`` and its temporaries come
    from a Scratch kept between calls: memory left with NaN by earlier calls (another
    prompt length, a larger one first) changes no bit of the result."""
    rng = np.random.default_rng(5)
    N, Nkv, H = 6, 2, 32
    scratch = gqa.Scratch()
    for view in scratch.take(((1 << 16,),)):
        view.fill(np.nan)
    for S, past in ((37, 0), (20, 5), (37, 0)):
        q = rng.standard_normal((N, S, H)).astype(np.float32)
        k = rng.standard_normal((Nkv, past + S, H)).astype(np.float32)
        v = rng.standard_normal((Nkv, past + S, H)).astype(np.float32)
        want = gqa.attend(q, k, v, past, past + S, 1 / np.sqrt(H), l2=4 * 4 * 2 * H * 16)
        out = np.full((S, N * H), np.nan, np.float32)
        got = gqa.attend(q, k, v, past, past + S, 1 / np.sqrt(H), l2=4 * 4 * 2 * H * 16,
                         out=out, scratch=scratch)
        assert got is out
        assert got.tobytes() == want.tobytes()  # every bit, NaN-free
        for view in scratch.take(((N, S, H), (Nkv, 64, H))):  # garbage for the next call
            view.fill(np.nan)


def test_scratch_is_one_per_process_and_bounded():
    """Every GroupQueryAttention node's prompt takes its temporaries from the process's
    SCRATCH (one block per thread, not one per node: 24 of them held ~300 MB after a 512-token
    prompt of the 0.5b model), which keeps at most ``keep`` bytes (a larger call's block is
    dropped after it)."""
    small = gqa.Scratch(keep=4096)
    small.take(((100,),))
    kept = small._local.buf
    (big,) = small.take(((2000,),))
    assert big.size == 2000 and small._local.buf is kept
    N, Nkv, H, S = 4, 2, 32, 24
    ours, theirs = _sessions(_model(N, Nkv, H, True, False, -1, True), False)
    gqa.SCRATCH._local.buf = None
    rng = np.random.default_rng(2)
    feed = {"query": rng.standard_normal((1, S, (N + 2 * Nkv) * H)).astype(np.float32),
            "past_key": np.zeros((1, Nkv, 0, H), np.float32),
            "past_value": np.zeros((1, Nkv, 0, H), np.float32),
            "seqlens_k": np.array([S - 1], np.int32),
            "total_sequence_length": np.array(S, np.int32), **_caches(H)}
    _assert_same(ours.run(None, feed), theirs.run(None, feed))
    assert gqa.SCRATCH._local.buf is not None


def test_lengths_past_the_cache_never_reach_the_kernels():
    """seqlens_k beyond the cache: the compiled kernels (which read keys unchecked) are not
    called; the numpy path answers as before (an error naming the node)."""
    N, Nkv, H = 4, 2, 64
    data = _model(N, Nkv, H, False, False, -1, True)
    ours, _ = _sessions(data, False)
    rng = np.random.default_rng(1)
    calls = []
    real = gqa.attend
    gqa.attend = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        feed = {"query": rng.standard_normal((1, 1, (N + 2 * Nkv) * H)).astype(np.float32),
                "past_key": np.zeros((1, Nkv, 8, H), np.float32),
                "past_value": np.zeros((1, Nkv, 8, H), np.float32),
                "seqlens_k": np.array([5000], np.int32),
                "total_sequence_length": np.array(9, np.int32)}
        with pytest.raises(onnxrun.errors.OnnxRunError, match="GroupQueryAttention"):
            ours.run(None, feed)  # the numpy path's error, naming the node
    finally:
        gqa.attend = real
    assert not calls


@pytest.mark.parametrize("rotary,interleaved,window,positions", [
    (True, False, -1, False), (True, True, 8, False), (False, False, -1, False),
    (True, False, -1, True)])
def test_decode_step_fast_path(rotary, interleaved, window, positions):
    """The shared-buffer decode step (onnxrun.genai's) takes _decode_step, the two compiled
    calls with little Python around them: the same bits as the general exact path of a
    session without the shared buffer, step after step, with position_ids too; calls it does
    not cover (a position past the rotary caches, a cache of another shape) fall back to the
    general path and its answer."""
    from onnxrun.providers.cpu.ops.contrib.transformer import GroupQueryAttention

    N, Nkv, H, S, steps = 8, 4, 32, 9, 4
    data = _model(N, Nkv, H, rotary, interleaved, window, True)
    if positions:  # position_ids: input 9, after the rotary caches
        import onnx

        m = onnx.load_from_string(data)
        m.graph.node[0].input.append("position_ids")
        m.graph.input.append(helper.make_tensor_value_info("position_ids", TP.INT64, [1, 1]))
        data = m.SerializeToString()
    sessions = []
    for share in (True, False):
        so = onnxrun.SessionOptions()
        so.intra_op_num_threads = 1
        if share:
            so.add_session_config_entry(SHARE_PAST_PRESENT, "1")
        sessions.append(onnxrun.InferenceSession(data, so))
    shared, plain = sessions
    caches = _caches(H) if rotary else {}
    rng = np.random.default_rng(11)
    P = S + steps + 3
    past = rng.standard_normal((1, Nkv, P, H)).astype(np.float32)
    kv_shared = (past.copy(), past.copy())
    taken = []
    real = GroupQueryAttention._decode_step

    def spy(self, *a):
        out = real(self, *a)
        taken.append(out is not None)
        return out

    module = gqa.kernels()
    one_call = module.decode_step
    calls = []
    module.decode_step = lambda *a: calls.append(a[6]) or one_call(*a)
    GroupQueryAttention._decode_step = spy
    try:
        for total in range(S + 1, S + 1 + steps):
            feed = {"query": (rng.standard_normal((1, 1, (N + 2 * Nkv) * H)) * 2).astype(
                        np.float32),
                    "seqlens_k": np.array([total - 1], np.int32),
                    "total_sequence_length": np.array(P, np.int32), **caches}
            if positions:
                feed["position_ids"] = np.array([[total + 100]], np.int64)
            got = shared.run(None, {**feed, "past_key": kv_shared[0],
                                    "past_value": kv_shared[1]})
            # the general path: no shared buffer, the past as the shared one was before
            before = [c.copy() for c in kv_shared]
            before[0][0, :, total - 1] = 0
            before[1][0, :, total - 1] = 0
            want = plain.run(None, {**feed, "past_key": before[0], "past_value": before[1]})
            for g, w in zip(got, want, strict=True):
                np.testing.assert_array_equal(g[:, :, :total] if g.ndim == 4 else g,
                                              w[:, :, :total] if w.ndim == 4 else w)
            np.testing.assert_array_equal(kv_shared[0], got[1])  # written in place
        assert taken == [True, False] * steps  # the plain session's: no shared buffer
        assert calls == list(range(S + 1, S + 1 + steps))  # each step in one call
        if rotary:  # a position past the caches: the general path's error, as before
            feed["seqlens_k"] = np.array([MAX_POS + 3], np.int32)
            feed["total_sequence_length"] = np.array(MAX_POS + 10, np.int32)
            big = np.zeros((1, Nkv, MAX_POS + 10, H), np.float32)
            if positions:
                feed["position_ids"] = np.array([[MAX_POS]], np.int64)
            with pytest.raises(onnxrun.errors.OnnxRunError, match="GroupQueryAttention"):
                shared.run(None, {**feed, "past_key": big, "past_value": big.copy()})
            assert taken[-1] is False
        # a cache whose head count is not the node's: not this path's case
        feed = {"query": np.ones((1, 1, (N + 2 * Nkv) * H), np.float32),
                "seqlens_k": np.array([3], np.int32),
                "total_sequence_length": np.array(P, np.int32), **caches}
        if positions:
            feed["position_ids"] = np.array([[3]], np.int64)
        odd = np.zeros((1, 2 * Nkv, P, H), np.float32)
        try:
            shared.run(None, {**feed, "past_key": odd, "past_value": odd.copy()})
        except onnxrun.errors.OnnxRunError:
            pass
        assert taken[-1] is False
    finally:
        GroupQueryAttention._decode_step = real
        module.decode_step = one_call
