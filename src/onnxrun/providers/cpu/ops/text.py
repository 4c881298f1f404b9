"""String operators: StringNormalizer, StringConcat, StringSplit, RegexFullMatch, and the n-gram
counter TfIdfVectorizer.

String tensors are numpy object arrays of Python ``str``; per-string work is a Python-level map
(there is no vectorized string engine), everything numeric is vectorized.
"""

from __future__ import annotations

import operator
import re

import numpy as np

from ..indices import as_intp
from ..kernels import KernelContext, op


def _as_str_array(x: np.ndarray) -> np.ndarray:
    if x.dtype.kind not in "OUS":
        raise TypeError(f"expected a string tensor, got {x.dtype}")
    return x


def _str_list(x: np.ndarray) -> list[str]:
    """The elements of a string tensor as Python str (bytes decoded as UTF-8)."""
    return [s.decode() if isinstance(s, bytes) else str(s) for s in x.reshape(-1).tolist()]


# -- StringNormalizer -------------------------------------------------------------------------

_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_ASCII_UPPER = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")


@op("StringNormalizer", 10)
class StringNormalizer:
    """Drops elements equal to a stop word (whole-element match, like onnxruntime) and changes
    case. Input [C] or [1, C]; an all-filtered input gives a single empty string."""

    def __init__(self, ctx: KernelContext, *, case_change_action="NONE", is_case_sensitive=0,
                 locale=None, stopwords=None):
        if case_change_action not in ("NONE", "LOWER", "UPPER"):
            raise ValueError(f"StringNormalizer: bad case_change_action '{case_change_action}'")
        self.action = case_change_action
        self.case_sensitive = bool(is_case_sensitive)
        # the "C"/"POSIX" locales map ASCII letters only; any other (default en_US.UTF-8)
        # follows Unicode case rules, as Python's str methods do
        ascii_only = locale in ("C", "POSIX")
        self.lower = (lambda s: s.translate(_ASCII_LOWER)) if ascii_only else str.lower
        self.upper = (lambda s: s.translate(_ASCII_UPPER)) if ascii_only else str.upper
        words = [w.decode() if isinstance(w, bytes) else w for w in (stopwords or [])]
        self.stops = frozenset(words if self.case_sensitive else map(self.lower, words))

    def __call__(self, X):
        _as_str_array(X)
        if X.ndim == 2 and X.shape[0] != 1 or X.ndim not in (1, 2):
            raise ValueError(f"StringNormalizer: input must be [C] or [1, C], got {X.shape}")
        items = _str_list(X)
        if self.stops:
            if self.case_sensitive:
                items = [s for s in items if s not in self.stops]
            else:
                lower = self.lower
                items = [s for s in items if lower(s) not in self.stops]
        if self.action == "LOWER":
            items = list(map(self.lower, items))
        elif self.action == "UPPER":
            items = list(map(self.upper, items))
        if not items:
            items = [""]
        out = np.empty(len(items), dtype=object)
        out[:] = items
        return out.reshape(1, -1) if X.ndim == 2 else out


# -- StringConcat / StringSplit ---------------------------------------------------------------

_concat = np.frompyfunc(operator.add, 2, 1)


@op("StringConcat", 20)
def StringConcat(X, Y):
    x = np.array(_str_list(_as_str_array(X)), dtype=object).reshape(X.shape)
    y = np.array(_str_list(_as_str_array(Y)), dtype=object).reshape(Y.shape)
    out = _concat(x, y)
    return np.asarray(out, dtype=object)


@op("StringSplit", 20)
def StringSplit(X, *, delimiter=None, maxsplit=None):
    _as_str_array(X)
    limit = -1 if maxsplit is None else int(maxsplit)
    strings = _str_list(X)
    if delimiter:
        # an empty string has no substrings (onnxruntime), not one empty one (Python)
        parts = [s.split(delimiter, limit) if s else [] for s in strings]
    else:
        # runs of whitespace separate; leading and trailing whitespace (also after the last
        # allowed split) is removed
        parts = [s.strip().split(None, limit) for s in strings]
    counts = np.array([len(p) for p in parts], dtype=np.int64)
    width = int(counts.max()) if counts.size else 0
    out = np.full((len(parts), width), "", dtype=object)
    for i, p in enumerate(parts):
        out[i, : len(p)] = p
    return out.reshape(*X.shape, width), counts.reshape(X.shape)


# -- RegexFullMatch ---------------------------------------------------------------------------

_POSIX = {"alnum": "0-9A-Za-z", "alpha": "A-Za-z", "ascii": "\\x00-\\x7f", "blank": "\\t ",
          "cntrl": "\\x00-\\x1f\\x7f", "digit": "0-9", "graph": "!-~", "lower": "a-z",
          "print": " -~", "punct": "!-/:-@\\[-`{-~", "space": "\\t\\n\\v\\f\\r ",
          "upper": "A-Z", "word": "0-9A-Za-z_", "xdigit": "0-9A-Fa-f"}
_RE2_UNSUPPORTED = re.compile(r"\(\?<?[=!]|\\[1-9]|\(\?P=")


def _re2_to_python(pattern: str) -> str:
    """Translate the RE2 syntax Python lacks (POSIX classes, \\z) and reject what RE2 lacks
    (lookaround, backreferences), so a pattern means the same as in onnxruntime."""
    if _RE2_UNSUPPORTED.search(pattern):
        raise ValueError(f"RegexFullMatch: pattern '{pattern}' uses lookaround or "
                         "backreferences, which RE2 does not support")

    def posix(m):
        neg, name = m.group(1), m.group(2)
        if name not in _POSIX:
            raise ValueError(f"RegexFullMatch: unknown POSIX class [:{name}:]")
        if neg:
            raise ValueError("RegexFullMatch: negated POSIX classes are not supported")
        return _POSIX[name]

    out = re.sub(r"\[:(\^?)([a-z]+):\]", posix, pattern)
    return re.sub(r"(?<!\\)((?:\\\\)*)\\z", r"\1\\Z", out)


@op("RegexFullMatch", 20)
class RegexFullMatch:
    def __init__(self, ctx: KernelContext, *, pattern=None):
        if pattern is None:
            raise ValueError("RegexFullMatch: the pattern attribute is required")
        try:
            self.regex = re.compile(_re2_to_python(pattern))
        except re.error as e:
            raise ValueError(f"RegexFullMatch: invalid pattern '{pattern}': {e}") from e

    def __call__(self, X):
        _as_str_array(X)
        match = self.regex.fullmatch
        flat = [match(s) is not None for s in _str_list(X)]
        return np.array(flat, dtype=bool).reshape(X.shape)


# -- TfIdfVectorizer --------------------------------------------------------------------------


_DENSE_LIMIT = 1 << 22  # key ranges up to this size use a direct lookup table


class _Lookup:
    """Exact-match map from sorted unique keys to int values: a dense table when the keys are
    integers within a small range (one gather per query), a binary search otherwise. With
    ``key_space``, queries are known to lie in [0, key_space) and need no range check."""

    def __init__(self, keys: np.ndarray, values: np.ndarray, key_space: int | None = None):
        self.keys, self.values = keys, values
        self.table = None
        self.checked = key_space is None or key_space > _DENSE_LIMIT
        if not self.checked:
            self.lo = 0
            self.table = np.full(key_space, -1, dtype=np.int64)
            self.table[keys] = values
        elif keys.dtype == np.int64 and keys.size and int(keys[-1]) - int(keys[0]) < _DENSE_LIMIT:
            self.lo = int(keys[0])
            self.table = np.full(int(keys[-1]) - self.lo + 2, -1, dtype=np.int64)
            self.table[keys - self.lo] = values

    def find(self, query: np.ndarray) -> np.ndarray:
        """The value of each query key, -1 where it is absent."""
        if self.table is not None:
            if not self.checked:
                return self.table[query]
            # out-of-range keys read the last slot, which is always -1
            q = query - self.lo
            q = np.where((q < 0) | (q >= len(self.table)), len(self.table) - 1, q)
            return self.table[q]
        at = np.clip(np.searchsorted(self.keys, query), 0, len(self.keys) - 1)
        return np.where(self.keys[at] == query, self.values[at], -1)


@op("TfIdfVectorizer", 9)
class TfIdfVectorizer:
    """N-gram counting: input tokens become vocabulary ids, every n-gram window (for each n and
    skip distance) becomes one integer key, and keys are matched against the pool with a
    sorted search; counts accumulate with one bincount."""

    def __init__(self, ctx: KernelContext, *, max_gram_length, max_skip_count, min_gram_length,
                 mode, ngram_counts, ngram_indexes, pool_int64s=None, pool_strings=None,
                 weights=None):
        if mode not in ("TF", "IDF", "TFIDF"):
            raise ValueError(f"TfIdfVectorizer: bad mode '{mode}'")
        self.mode = mode
        self.min_n, self.max_n = int(min_gram_length), int(max_gram_length)
        self.max_skip = int(max_skip_count)
        self.is_str = pool_strings is not None and len(pool_strings) > 0
        if self.is_str:
            pool = np.array([s.decode() if isinstance(s, bytes) else s for s in pool_strings],
                            dtype=str)
        else:
            pool = np.asarray(pool_int64s if pool_int64s is not None else [], dtype=np.int64)
        self.output_size = int(max(ngram_indexes)) + 1 if len(ngram_indexes) else 0
        self.weights = None if weights is None or len(weights) == 0 else \
            np.asarray(weights, dtype=np.float32)
        self.vocab = np.unique(pool)
        self.base = len(self.vocab) + 1  # id 0 = token not in the vocabulary
        pool_ids = np.searchsorted(self.vocab, pool) + 1 if pool.size else pool
        self.token_ids = None if self.is_str or not self.vocab.size else \
            _Lookup(self.vocab, np.arange(1, self.base, dtype=np.int64))
        # per n: the pool n-grams' keys -> output column
        self.tables: dict[int, _Lookup] = {}
        counts = list(ngram_counts) + [len(pool)]
        gram_index = 0
        for i in range(len(ngram_counts)):
            n = i + 1
            start, stop = counts[i], counts[i + 1]
            num = (stop - start) // n if stop > start else 0
            if num and self.min_n <= n <= self.max_n:
                grams = pool_ids[start:start + num * n].reshape(num, n)
                keys = self._keys([grams[:, k] for k in range(n)])
                cols = np.asarray(ngram_indexes[gram_index:gram_index + num], dtype=np.int64)
                mapping = dict(zip(keys.tolist(), cols.tolist(), strict=True))  # last one wins
                k_sorted = np.array(sorted(mapping), dtype=keys.dtype)
                self.tables[n] = _Lookup(k_sorted, np.array(
                    [mapping[k] for k in k_sorted.tolist()], dtype=np.int64), self.base ** n)
            gram_index += num

    def _keys(self, columns: list[np.ndarray]) -> np.ndarray:
        n = len(columns)
        if self.base ** n < 2 ** 62:
            key = np.zeros(columns[0].shape, dtype=np.int64)
            for c in columns:
                key = key * self.base + c
            return key
        key = np.zeros(columns[0].shape, dtype=object)  # exact big integers
        for c in columns:
            key = key * self.base + c.astype(object)
        return key

    def __call__(self, X):
        if X.ndim == 0:
            X = X.reshape(1)
        if X.ndim not in (1, 2):
            raise ValueError(f"TfIdfVectorizer: input must be [C] or [B, C], got {X.shape}")
        if X.ndim == 2 and X.shape[0] == 0:  # as onnxruntime
            raise ValueError("TfIdfVectorizer: input shape must be [C] or [B, C] with B > 0, "
                             f"got {list(X.shape)}")
        rows = X.reshape(1, -1) if X.ndim == 1 else X
        b, c = rows.shape
        freq = None
        if rows.size and self.tables and self.vocab.size:
            if self.is_str:
                tokens = rows.astype(str)
                pos = np.clip(np.searchsorted(self.vocab, tokens), 0, self.vocab.size - 1)
                ids = np.where(self.vocab[pos] == tokens, pos + 1, 0)
            else:
                ids = np.maximum(self.token_ids.find(rows.astype(np.int64)), 0)
            row_idx = np.arange(b)[:, None]
            hits = []
            for skip in range(1, self.max_skip + 2):
                for n, table in self.tables.items():
                    if n == 1 and skip > 1:
                        continue  # unigrams do not depend on the skip distance
                    span = (n - 1) * skip
                    if span >= c:
                        continue
                    starts = c - span
                    key = self._keys([ids[:, k * skip:k * skip + starts] for k in range(n)])
                    # windows with an unknown token (a 0 digit) never match a pool key
                    col = table.find(key)
                    hit = col >= 0
                    hits.append((row_idx * self.output_size + col)[hit])
            if hits:  # one bincount for all n-gram sizes and skips
                flat = np.concatenate(hits)
                freq = np.bincount(as_intp(flat), minlength=b * self.output_size)
                freq = freq.reshape(b, -1)
        if freq is None:
            freq = np.zeros((b, self.output_size), dtype=np.int64)
        f = freq.astype(np.float32)
        if self.mode == "TF":
            y = f
        elif self.mode == "IDF":
            y = (freq > 0).astype(np.float32)
            if self.weights is not None:
                y = y * self.weights
        else:
            y = f * self.weights if self.weights is not None else f
        return y.reshape(-1) if X.ndim == 1 else y
