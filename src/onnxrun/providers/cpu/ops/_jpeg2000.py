"""A JPEG 2000 (ITU-T T.800) decoder for ImageDecoder, in Python and numpy.

Scope: JP2 files and raw codestreams, any tiling, any number of quality layers, all five
progression orders with the default (maximal) precincts, the reversible 5/3 wavelet with the
reversible color transform, unquantized coefficients (what lossless encoders such as OpenJPEG
and Pillow write by default), and the code-block styles "reset contexts", "predictable
termination" and "segmentation symbols". The irreversible 9/7 path, custom precincts, selective
arithmetic bypass, per-pass termination, vertically causal contexts and packed packet headers
raise NotImplementedError.

The MQ arithmetic decoder and the bit-plane (EBCOT tier-1) passes are inherently serial and run
per coefficient in Python; the wavelet and color transforms are vectorized.
"""

from __future__ import annotations

import struct

import numpy as np

# -- MQ arithmetic decoder (Annex C) -------------------------------------------------------------

_QE = [0x5601, 0x3401, 0x1801, 0x0AC1, 0x0521, 0x0221, 0x5601, 0x5401, 0x4801, 0x3801,
       0x3001, 0x2401, 0x1C01, 0x1601, 0x5601, 0x5401, 0x5101, 0x4801, 0x3801, 0x3401,
       0x3001, 0x2801, 0x2401, 0x2201, 0x1C01, 0x1801, 0x1601, 0x1401, 0x1201, 0x1101,
       0x0AC1, 0x09C1, 0x08A1, 0x0521, 0x0441, 0x02A1, 0x0221, 0x0141, 0x0111, 0x0085,
       0x0049, 0x0025, 0x0015, 0x0009, 0x0005, 0x0001, 0x5601]
_NMPS = [1, 2, 3, 4, 5, 38, 7, 8, 9, 10, 11, 12, 13, 29, 15, 16, 17, 18, 19, 20, 21, 22, 23,
         24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44,
         45, 45, 46]
_NLPS = [1, 6, 9, 12, 29, 33, 6, 14, 14, 14, 17, 18, 20, 21, 14, 14, 15, 16, 17, 18, 19, 19,
         20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40,
         41, 42, 43, 46]
_SWITCH = [1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1] + [0] * 32

_CTX_RL = 17  # run-length context
_CTX_UNI = 18  # uniform context


class _MQDecoder:
    __slots__ = ("data", "bp", "a", "c", "ct", "state", "mps")

    def __init__(self, data: bytes) -> None:
        self.data = data + b"\xff\xff"  # reading past the end behaves as a marker
        self.bp = 0
        self.state = [0] * 19
        self.mps = [0] * 19
        self.reset_contexts()
        self.c = self.data[0] << 16
        self._bytein()
        self.c = (self.c << 7) & 0xFFFFFFFF
        self.ct -= 7
        self.a = 0x8000

    def reset_contexts(self) -> None:
        self.state[:] = [0] * 19
        self.mps[:] = [0] * 19
        self.state[0] = 4
        self.state[_CTX_RL] = 3
        self.state[_CTX_UNI] = 46

    def _bytein(self) -> None:
        data, bp = self.data, self.bp
        if data[bp] == 0xFF:
            if data[bp + 1] > 0x8F:
                self.c += 0xFF00
                self.ct = 8
            else:
                self.bp = bp + 1
                self.c += data[bp + 1] << 9
                self.ct = 7
        else:
            self.bp = bp + 1
            self.c += data[bp + 1] << 8
            self.ct = 8
        if self.bp >= len(data) - 2:  # keep feeding 0xFF past the end
            self.bp = len(data) - 2

    def decode(self, cx: int) -> int:
        st = self.state[cx]
        qe = _QE[st]
        a = self.a - qe
        if (self.c >> 16) < qe:
            # LPS exchange
            if a < qe:
                d = self.mps[cx]
                self.state[cx] = _NMPS[st]
            else:
                d = 1 - self.mps[cx]
                if _SWITCH[st]:
                    self.mps[cx] = d
                self.state[cx] = _NLPS[st]
            a = qe
        else:
            self.c -= qe << 16
            if a & 0x8000:
                self.a = a
                return self.mps[cx]
            # MPS exchange
            if a < qe:
                d = 1 - self.mps[cx]
                if _SWITCH[st]:
                    self.mps[cx] = d
                self.state[cx] = _NLPS[st]
            else:
                d = self.mps[cx]
                self.state[cx] = _NMPS[st]
        # renormalize
        c, ct = self.c, self.ct
        while True:
            if ct == 0:
                self.c, self.ct = c, ct
                self._bytein()
                c, ct = self.c, self.ct
            a <<= 1
            c = (c << 1) & 0xFFFFFFFF
            ct -= 1
            if a & 0x8000:
                break
        self.a, self.c, self.ct = a, c, ct
        return d


# -- tier-1: bit-plane decoding of one code-block (Annex D) -------------------------------------


def _zc_table(orient: int) -> list[int]:
    """Zero-coding context for every (h, v, d) neighbor count, indexed h*15 + v*5 + d."""
    table = [0] * 45
    for h in range(3):
        for v in range(3):
            for d in range(5):
                if orient == 3:  # HH
                    hv = h + v
                    if d >= 3:
                        c = 8
                    elif d == 2:
                        c = 7 if hv >= 1 else 6
                    elif d == 1:
                        c = 5 if hv >= 2 else (4 if hv == 1 else 3)
                    else:
                        c = 2 if hv >= 2 else (1 if hv == 1 else 0)
                else:
                    hh, vv = (v, h) if orient == 1 else (h, v)  # HL swaps the roles
                    if hh == 2:
                        c = 8
                    elif hh == 1:
                        c = 7 if vv >= 1 else (6 if d >= 1 else 5)
                    elif vv == 2:
                        c = 4
                    elif vv == 1:
                        c = 3
                    else:
                        c = 2 if d >= 2 else (1 if d == 1 else 0)
                table[h * 15 + v * 5 + d] = c
    return table


_ZC = [_zc_table(o) for o in range(4)]
# sign context and xor bit by (clamped horizontal, vertical contribution) + 1
_SC = {(2, 2): (13, 0), (2, 1): (12, 0), (2, 0): (11, 0), (1, 2): (10, 0), (1, 1): (9, 0),
       (1, 0): (10, 1), (0, 2): (11, 1), (0, 1): (12, 1), (0, 0): (13, 1)}


def _decode_codeblock(data: bytes, w: int, h: int, numbps: int, passes: int, orient: int,
                      style: int) -> np.ndarray:
    """Signed integer coefficients of a w x h code-block from its MQ codeword."""
    out = np.zeros((h, w), dtype=np.int64)
    if passes == 0 or numbps <= 0 or w == 0 or h == 0:
        return out
    mq = _MQDecoder(data)
    zc = _ZC[orient]
    # padded state grids (1-cell border): significance, sign (1 negative), refined, visited
    pw = w + 2
    sig = [0] * ((h + 2) * pw)
    neg = [0] * ((h + 2) * pw)
    refined = [0] * ((h + 2) * pw)
    mag = [0] * ((h + 2) * pw)
    visited = [0] * ((h + 2) * pw)
    reset = style & 0x02
    segsym = style & 0x20

    def counts(i):
        hcount = sig[i - 1] + sig[i + 1]
        vcount = sig[i - pw] + sig[i + pw]
        dcount = sig[i - pw - 1] + sig[i - pw + 1] + sig[i + pw - 1] + sig[i + pw + 1]
        return hcount, vcount, dcount

    def decode_sign(i):
        hc = (sig[i - 1] * (1 - 2 * neg[i - 1]) + sig[i + 1] * (1 - 2 * neg[i + 1]))
        vc = (sig[i - pw] * (1 - 2 * neg[i - pw]) + sig[i + pw] * (1 - 2 * neg[i + pw]))
        ctx, xor = _SC[(max(-1, min(1, hc)) + 1, max(-1, min(1, vc)) + 1)]
        return mq.decode(ctx) ^ xor

    def stripe_order():
        for y0 in range(0, h, 4):
            for x in range(w):
                yield y0, x

    plane = numbps - 1
    kind = 2  # the first pass is a cleanup pass
    for _ in range(passes):
        if plane < 0:
            break
        bit = 1 << plane
        if kind == 0:  # significance propagation
            for y0, x in stripe_order():
                for y in range(y0, min(y0 + 4, h)):
                    i = (y + 1) * pw + x + 1
                    if sig[i]:
                        continue
                    hc, vc, dc = counts(i)
                    if hc + vc + dc == 0:
                        continue
                    visited[i] = 1
                    if mq.decode(zc[hc * 15 + vc * 5 + dc]):
                        neg[i] = decode_sign(i)
                        sig[i] = 1
                        mag[i] |= bit
        elif kind == 1:  # magnitude refinement
            for y0, x in stripe_order():
                for y in range(y0, min(y0 + 4, h)):
                    i = (y + 1) * pw + x + 1
                    if not sig[i] or visited[i]:
                        continue
                    if refined[i]:
                        ctx = 16
                    else:
                        hc, vc, dc = counts(i)
                        ctx = 15 if hc + vc + dc else 14
                        refined[i] = 1
                    if mq.decode(ctx):
                        mag[i] |= bit
        else:  # cleanup
            for y0, x in stripe_order():
                y = y0
                y_end = min(y0 + 4, h)
                if y_end - y0 == 4:
                    col = [(yy + 1) * pw + x + 1 for yy in range(y0, y_end)]
                    if all(not sig[i] and not visited[i] and sum(counts(i)) == 0 for i in col):
                        if not mq.decode(_CTX_RL):
                            continue
                        run = (mq.decode(_CTX_UNI) << 1) | mq.decode(_CTX_UNI)
                        i = col[run]
                        neg[i] = decode_sign(i)
                        sig[i] = 1
                        mag[i] |= bit
                        y = y0 + run + 1
                for yy in range(y, y_end):
                    i = (yy + 1) * pw + x + 1
                    if sig[i] or visited[i]:
                        continue
                    hc, vc, dc = counts(i)
                    if mq.decode(zc[hc * 15 + vc * 5 + dc]):
                        neg[i] = decode_sign(i)
                        sig[i] = 1
                        mag[i] |= bit
            if segsym:
                for _k in range(4):
                    mq.decode(_CTX_UNI)
            visited = [0] * len(visited)
        if reset:
            mq.reset_contexts()
        if kind == 2:
            kind = 0
            plane -= 1
        else:
            kind += 1
    m = np.array(mag, dtype=np.int64).reshape(h + 2, pw)[1:-1, 1:-1]
    s = np.array(neg, dtype=bool).reshape(h + 2, pw)[1:-1, 1:-1]
    return np.where(s, -m, m)


# -- tier-2: packet headers (Annex B) ------------------------------------------------------------


class _BitReader:
    """Packet-header bits: MSB first, a 0 bit stuffed after every 0xFF byte."""

    def __init__(self, data: bytes, pos: int) -> None:
        self.data, self.pos = data, pos
        self.buf = 0
        self.left = 0
        self.last = 0

    def bit(self) -> int:
        if self.left == 0:
            byte = self.data[self.pos] if self.pos < len(self.data) else 0
            self.pos += 1
            self.left = 7 if self.last == 0xFF else 8
            self.buf = byte
            self.last = byte
        self.left -= 1
        return (self.buf >> self.left) & 1

    def bits(self, n: int) -> int:
        v = 0
        for _ in range(n):
            v = (v << 1) | self.bit()
        return v

    def align(self) -> int:
        """End of the header: skip the stuffed byte after a final 0xFF; the body offset."""
        if self.last == 0xFF and self.left == 0:
            self.pos += 1
        self.left = 0
        return self.pos


class _TagTree:
    def __init__(self, w: int, h: int) -> None:
        self.levels = []
        while True:
            self.levels.append((w, h))
            if w == 1 and h == 1:
                break
            w, h = (w + 1) // 2, (h + 1) // 2
        n = sum(a * b for a, b in self.levels)
        self.value = [1 << 30] * n
        self.low = [0] * n
        self.offsets = []
        off = 0
        for a, b in self.levels:
            self.offsets.append(off)
            off += a * b

    def decode(self, reader: _BitReader, x: int, y: int, threshold: int) -> bool:
        """Whether the leaf's value is below ``threshold`` (reading bits as needed)."""
        path = []
        for lvl, (lw, _) in enumerate(self.levels):
            path.append(self.offsets[lvl] + (y >> lvl) * lw + (x >> lvl))
        low = 0
        for node in reversed(path):
            if low > self.low[node]:
                self.low[node] = low
            else:
                low = self.low[node]
            while low < threshold and low < self.value[node]:
                if reader.bit():
                    self.value[node] = low
                else:
                    low += 1
            self.low[node] = low
        return self.value[path[0]] < threshold

    def leaf(self, x: int, y: int) -> int:
        return self.value[y * self.levels[0][0] + x]


def _num_passes(r: _BitReader) -> int:
    if not r.bit():
        return 1
    if not r.bit():
        return 2
    v = r.bits(2)
    if v < 3:
        return 3 + v
    v = r.bits(5)
    if v < 31:
        return 6 + v
    return 37 + r.bits(7)


# -- geometry and the decoder ------------------------------------------------------------------


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class _CodeBlock:
    __slots__ = ("x0", "y0", "x1", "y1", "included", "lblock", "passes", "data", "zero_bp")

    def __init__(self, x0, y0, x1, y1):
        self.x0, self.y0, self.x1, self.y1 = x0, y0, x1, y1
        self.included = False
        self.lblock = 3
        self.passes = 0
        self.data = bytearray()
        self.zero_bp = 0


class _Band:
    def __init__(self, orient, x0, y0, x1, y1, cbw, cbh, mb):
        self.orient = orient
        self.x0, self.y0, self.x1, self.y1 = x0, y0, x1, y1
        self.mb = mb
        nx = _ceil_div(x1, cbw) - x0 // cbw if x1 > x0 else 0
        ny = _ceil_div(y1, cbh) - y0 // cbh if y1 > y0 else 0
        self.nx, self.ny = nx, ny
        self.blocks = []
        for j in range(ny):
            for i in range(nx):
                bx = (x0 // cbw + i) * cbw
                by = (y0 // cbh + j) * cbh
                self.blocks.append(_CodeBlock(max(bx, x0), max(by, y0), min(bx + cbw, x1),
                                              min(by + cbh, y1)))
        self.incl = _TagTree(max(nx, 1), max(ny, 1))
        self.zbp = _TagTree(max(nx, 1), max(ny, 1))


def _parse_cod(body: bytes) -> dict:
    scod = body[0]
    cod = {"scod": scod, "order": body[1], "layers": struct.unpack(">H", body[2:4])[0],
           "mct": body[4]}
    cod.update(_parse_spcod(body[5:], scod))
    return cod


def _parse_spcod(sp: bytes, scod: int) -> dict:
    if scod & 1:
        raise NotImplementedError("ImageDecoder: JPEG 2000 custom precincts are not supported")
    return {"levels": sp[0], "cbw": 1 << (sp[1] + 2), "cbh": 1 << (sp[2] + 2),
            "style": sp[3], "reversible": sp[4] == 1}


def _parse_qcd(body: bytes) -> dict:
    sq = body[0]
    if sq & 0x1F != 0:
        raise NotImplementedError("ImageDecoder: quantized (lossy) JPEG 2000 is not supported")
    return {"guard": sq >> 5, "eps": [b >> 3 for b in body[1:]]}


def _idwt53_1d(y: np.ndarray, i0: int) -> np.ndarray:
    """Inverse reversible 5/3 lifting along the last axis of an interleaved signal that starts
    at absolute coordinate ``i0`` (even coordinates hold low-pass samples)."""
    n = y.shape[-1]
    if n == 1:
        return y if i0 % 2 == 0 else y // 2
    k = np.arange(n)
    period = 2 * (n - 1)

    def mirror(idx):
        idx = np.mod(idx, period)
        return np.where(idx >= n, period - idx, idx)

    left, right = mirror(k - 1), mirror(k + 1)
    even = ((i0 + k) % 2) == 0
    x = y.copy()
    x[..., even] = y[..., even] - ((y[..., left[even]] + y[..., right[even]] + 2) >> 2)
    odd = ~even
    x[..., odd] = y[..., odd] + ((x[..., left[odd]] + x[..., right[odd]]) >> 1)
    return x


def _interleave(low: np.ndarray, high: np.ndarray, i0: int, axis: int) -> np.ndarray:
    n = low.shape[axis] + high.shape[axis]
    shape = list(low.shape)
    shape[axis] = n
    out = np.empty(shape, dtype=np.int64)
    first_low = 0 if i0 % 2 == 0 else 1
    sl_low = [slice(None)] * low.ndim
    sl_high = [slice(None)] * low.ndim
    sl_low[axis] = slice(first_low, None, 2)
    sl_high[axis] = slice(1 - first_low, None, 2)
    out[tuple(sl_low)] = low
    out[tuple(sl_high)] = high
    return out


def decode_jpeg2000(data: bytes) -> np.ndarray:
    """Decode a JP2 file or J2K codestream into an (H, W, 3) uint8 RGB array."""
    if data[:4] == b"\xff\x4f\xff\x51":
        cs = data
    else:
        cs = None
        i = 0
        while i + 8 <= len(data):
            length, kind = struct.unpack(">I4s", data[i:i + 8])
            hdr = 8
            if length == 1:
                length = struct.unpack(">Q", data[i + 8:i + 16])[0]
                hdr = 16
            if kind == b"jp2c":
                cs = data[i + hdr:i + length] if length else data[i + hdr:]
                break
            if length == 0:
                break
            i += length
        if cs is None:
            raise ValueError("ImageDecoder: JP2 file without a codestream")
    return _decode_codestream(cs)


def _decode_codestream(cs: bytes) -> np.ndarray:
    pos = 2
    siz = None
    cod_main: dict = {}
    coc_main: dict[int, dict] = {}
    qcd_main: dict = {}
    qcc_main: dict[int, dict] = {}
    tiles: dict[int, list] = {}
    while pos + 4 <= len(cs):
        marker = struct.unpack(">H", cs[pos:pos + 2])[0]
        if marker == 0xFFD9:
            break
        length = struct.unpack(">H", cs[pos + 2:pos + 4])[0]
        body = cs[pos + 4:pos + 2 + length]
        if marker == 0xFF51:
            rs, xs, ys, xo, yo, xt, yt, xto, yto, nc = struct.unpack(">HIIIIIIIIH", body[:36])
            comps = []
            for k in range(nc):
                ss, dx, dy = body[36 + 3 * k:39 + 3 * k]
                comps.append({"depth": (ss & 0x7F) + 1, "signed": bool(ss & 0x80),
                              "dx": dx, "dy": dy})
            siz = (xs, ys, xo, yo, xt, yt, xto, yto, comps)
        elif marker == 0xFF52:
            cod_main = _parse_cod(body)
        elif marker == 0xFF53:
            ci, rest = (body[0], body[1:]) if siz and len(siz[8]) < 257 else \
                (struct.unpack(">H", body[:2])[0], body[2:])
            coc_main[ci] = _parse_spcod(rest[1:], rest[0])
        elif marker == 0xFF5C:
            qcd_main = _parse_qcd(body)
        elif marker == 0xFF5D:
            ci, rest = (body[0], body[1:]) if siz and len(siz[8]) < 257 else \
                (struct.unpack(">H", body[:2])[0], body[2:])
            qcc_main[ci] = _parse_qcd(rest)
        elif marker in (0xFF60, 0xFF61):
            raise NotImplementedError("ImageDecoder: JPEG 2000 packed headers are not supported")
        elif marker == 0xFF90:
            isot, psot, tpsot, _ = struct.unpack(">HIBB", body[:8])
            end = pos + psot if psot else len(cs) - 2
            # tile-part header markers up to SOD
            p = pos + 2 + length
            tile_cod: dict = {}
            while p < end:
                m = struct.unpack(">H", cs[p:p + 2])[0]
                if m == 0xFF93:
                    p += 2
                    break
                ln = struct.unpack(">H", cs[p + 2:p + 4])[0]
                tb = cs[p + 4:p + 2 + ln]
                if m == 0xFF52:
                    tile_cod["cod"] = _parse_cod(tb)
                elif m == 0xFF5C:
                    tile_cod["qcd"] = _parse_qcd(tb)
                elif m in (0xFF53, 0xFF5D, 0xFF5E, 0xFF61):
                    raise NotImplementedError(
                        "ImageDecoder: JPEG 2000 tile-part COC/QCC/POC/PPT are not supported")
                p += 2 + ln
            tiles.setdefault(isot, []).append((tile_cod, cs[p:end]))
            pos = end
            continue
        pos += 2 + length
    if siz is None or not cod_main or not qcd_main:
        raise ValueError("ImageDecoder: JPEG 2000 codestream without SIZ/COD/QCD")
    xs, ys, xo, yo, xt, yt, xto, yto, comps = siz
    planes = [np.zeros((_ceil_div(ys, c["dy"]) - _ceil_div(yo, c["dy"]),
                        _ceil_div(xs, c["dx"]) - _ceil_div(xo, c["dx"])), dtype=np.int64)
              for c in comps]
    ntx = _ceil_div(xs - xto, xt)
    for tidx, parts in sorted(tiles.items()):
        tcod = parts[0][0]
        cod = tcod.get("cod", cod_main)
        qcd = tcod.get("qcd", qcd_main)
        body = b"".join(p[1] for p in parts)
        p, q = tidx % ntx, tidx // ntx
        tx0, ty0 = max(xto + p * xt, xo), max(yto + q * yt, yo)
        tx1, ty1 = min(xto + (p + 1) * xt, xs), min(yto + (q + 1) * yt, ys)
        comp_data = _decode_tile(body, comps, cod, coc_main, qcd, qcc_main,
                                 (tx0, ty0, tx1, ty1))
        if cod["mct"] and len(comps) >= 3:
            if not cod["reversible"]:
                raise NotImplementedError("ImageDecoder: irreversible JPEG 2000 is not supported")
            y0c, y1c, y2c = comp_data[:3]
            g = y0c - ((y1c + y2c) >> 2)
            comp_data[:3] = [y2c + g, g, y1c + g]
        for k, c in enumerate(comps):
            cx0, cy0 = _ceil_div(tx0, c["dx"]), _ceil_div(ty0, c["dy"])
            ox, oy = cx0 - _ceil_div(xo, c["dx"]), cy0 - _ceil_div(yo, c["dy"])
            arr = comp_data[k]
            planes[k][oy:oy + arr.shape[0], ox:ox + arr.shape[1]] = arr
    out = []
    for c, plane in zip(comps, planes, strict=True):
        v = plane if c["signed"] else plane + (1 << (c["depth"] - 1))
        v = np.clip(v, 0, (1 << c["depth"]) - 1)
        if c["depth"] > 8:
            v = v >> (c["depth"] - 8)
        elif c["depth"] < 8:
            v = (v * 255) // ((1 << c["depth"]) - 1)
        if c["dx"] != 1 or c["dy"] != 1:
            v = np.repeat(np.repeat(v, c["dy"], axis=0), c["dx"], axis=1)
        out.append(v.astype(np.uint8))
    h = min(o.shape[0] for o in out)
    w = min(o.shape[1] for o in out)
    out = [o[:h, :w] for o in out]
    if len(out) >= 3:
        return np.stack(out[:3], axis=-1)
    return np.repeat(out[0][..., None], 3, axis=2)


def _decode_tile(body, comps, cod, coc, qcd, qcc, tile):
    tx0, ty0, tx1, ty1 = tile
    # per component: resolutions -> bands
    layout = []
    for k, c in enumerate(comps):
        cc = dict(cod)
        cc.update(coc.get(k, {}))
        if not cc["reversible"]:
            raise NotImplementedError("ImageDecoder: irreversible (9/7) JPEG 2000 is not "
                                      "supported")
        if cc["style"] & ~(0x02 | 0x10 | 0x20):
            raise NotImplementedError(f"ImageDecoder: JPEG 2000 code-block style "
                                      f"{cc['style']:#x} is not supported")
        q = qcc.get(k, qcd)
        nl = cc["levels"]
        cx0, cy0 = _ceil_div(tx0, c["dx"]), _ceil_div(ty0, c["dy"])
        cx1, cy1 = _ceil_div(tx1, c["dx"]), _ceil_div(ty1, c["dy"])
        res = []
        for r in range(nl + 1):
            bands = []
            if r == 0:
                s = 1 << nl
                bands.append(_Band(0, _ceil_div(cx0, s), _ceil_div(cy0, s), _ceil_div(cx1, s),
                                   _ceil_div(cy1, s), cc["cbw"], cc["cbh"],
                                   q["guard"] + q["eps"][0] - 1))
            else:
                nb = nl - r + 1
                s = 1 << nb
                half = 1 << (nb - 1)
                for bi, (xob, yob) in enumerate(((1, 0), (0, 1), (1, 1))):
                    eps = q["eps"][1 + 3 * (r - 1) + bi]
                    bands.append(_Band(bi + 1, _ceil_div(cx0 - half * xob, s),
                                       _ceil_div(cy0 - half * yob, s),
                                       _ceil_div(cx1 - half * xob, s),
                                       _ceil_div(cy1 - half * yob, s), cc["cbw"], cc["cbh"],
                                       q["guard"] + eps - 1))
            res.append(bands)
        layout.append({"cod": cc, "res": res, "box": (cx0, cy0, cx1, cy1), "nl": nl})
    # packet sequence for the progression order (one precinct per resolution)
    layers = cod["layers"]
    max_r = max(lc["nl"] for lc in layout) + 1
    order = cod["order"]
    seq = []
    if order == 0:  # LRCP
        seq = [(ly, r, k) for ly in range(layers) for r in range(max_r)
               for k in range(len(comps))]
    elif order == 1:  # RLCP
        seq = [(ly, r, k) for r in range(max_r) for ly in range(layers)
               for k in range(len(comps))]
    elif order == 2:  # RPCL
        seq = [(ly, r, k) for r in range(max_r) for k in range(len(comps))
               for ly in range(layers)]
    elif order in (3, 4):  # PCRL, CPRL
        seq = [(ly, r, k) for k in range(len(comps)) for r in range(max_r)
               for ly in range(layers)]
    else:
        raise ValueError(f"ImageDecoder: bad JPEG 2000 progression order {order}")
    pos = 0
    for ly, r, k in seq:
        lc = layout[k]
        if r > lc["nl"]:
            continue
        if lc["cod"]["scod"] & 2 and body[pos:pos + 2] == b"\xff\x91":
            pos += 6  # SOP marker segment
        reader = _BitReader(body, pos)
        contributions = []
        if reader.bit():
            for band in lc["res"][r]:
                for idx, cb in enumerate(band.blocks):
                    bx, by = idx % band.nx, idx // band.nx
                    if cb.included:
                        inc = reader.bit()
                    else:
                        inc = band.incl.decode(reader, bx, by, ly + 1)
                    if not inc:
                        continue
                    if not cb.included:
                        t = 1
                        while not band.zbp.decode(reader, bx, by, t):
                            t += 1
                        cb.zero_bp = band.zbp.leaf(bx, by)
                        cb.included = True
                    npass = _num_passes(reader)
                    while reader.bit():
                        cb.lblock += 1
                    nbits = cb.lblock + (npass.bit_length() - 1)
                    contributions.append((cb, npass, reader.bits(nbits)))
        pos = reader.align()
        if lc["cod"]["scod"] & 4 and body[pos:pos + 2] == b"\xff\x92":
            pos += 2  # EPH marker
        for cb, npass, length in contributions:
            cb.data += body[pos:pos + length]
            cb.passes += npass
            pos += length
    # tier-1 and inverse wavelet per component
    result = []
    for lc in layout:
        res = lc["res"]
        subbands = []
        for bands in res:
            arrs = []
            for band in bands:
                arr = np.zeros((max(band.y1 - band.y0, 0), max(band.x1 - band.x0, 0)),
                               dtype=np.int64)
                for cb in band.blocks:
                    coeffs = _decode_codeblock(bytes(cb.data), cb.x1 - cb.x0, cb.y1 - cb.y0,
                                               band.mb - cb.zero_bp, cb.passes,
                                               band.orient, lc["cod"]["style"])
                    arr[cb.y0 - band.y0:cb.y1 - band.y0, cb.x0 - band.x0:cb.x1 - band.x0] = \
                        coeffs
                arrs.append(arr)
            subbands.append(arrs)
        image = subbands[0][0]
        cx0, cy0, cx1, cy1 = lc["box"]
        nl = lc["nl"]
        for r in range(1, nl + 1):
            s = 1 << (nl - r)
            rx0, ry0 = _ceil_div(cx0, s), _ceil_div(cy0, s)
            hl, lh, hh = subbands[r]
            # horizontal synthesis of the low and high rows, then vertical
            low_rows = _interleave(image, hl, rx0, axis=1)
            high_rows = _interleave(lh, hh, rx0, axis=1)
            if low_rows.shape[1]:
                low_rows = _idwt53_1d(low_rows, rx0)
            if high_rows.shape[1]:
                high_rows = _idwt53_1d(high_rows, rx0)
            full = _interleave(low_rows, high_rows, ry0, axis=0)
            if full.shape[0]:
                image = _idwt53_1d(full.T, ry0).T
            else:
                image = full
        result.append(image)
    return result
