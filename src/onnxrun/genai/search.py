"""Search: the sequences so far and the choice of the next tokens (greedy, sampling, beam).

Defined as onnxruntime-genai's CPU search defines it, so that the same logits give the same
tokens: greedy takes the first maximum; sampling draws from ``std::mt19937`` seeded with
``random_seed`` through libstdc++'s ``std::discrete_distribution`` (reproduced below on numpy's
MT19937), over the same float32 probabilities (onnxruntime-genai 0.18's
ComputeSampledCategorical and FindNucleus); beam search keeps ``2 * num_beams`` candidates per
batch entry in the scorer's order. Logits processors (min_length, repetition_penalty) run
before the choice, as there.
"""

from __future__ import annotations

import numpy as np

from .. import errors


class MT19937:
    """``std::mt19937`` seeded with one integer (``init_genrand``), on numpy's generator."""

    def __init__(self, seed: int | None) -> None:
        self._bits = np.random.MT19937()
        if seed is None:  # genai seeds from std::random_device when random_seed is -1
            return
        key = np.empty(624, np.uint32)
        x = int(seed) & 0xFFFFFFFF
        for i in range(624):
            key[i] = x
            x = (1812433253 * (x ^ (x >> 30)) + i + 1) & 0xFFFFFFFF
        self._bits.state = {"bit_generator": "MT19937", "state": {"key": key, "pos": 624}}

    def canonical(self) -> float:
        """libstdc++'s ``generate_canonical<double, 53>``: two 32-bit draws."""
        lo, hi = (float(v) for v in self._bits.random_raw(2))
        value = (lo + hi * 4294967296.0) / 18446744073709551616.0
        return value if value < 1.0 else float(np.nextafter(1.0, 0.0))

    def discrete(self, weights: np.ndarray) -> int:
        """libstdc++'s ``std::discrete_distribution<>`` on ``weights``: normalised and summed
        in double, the last cumulative value forced to 1, then a lower bound."""
        p = np.asarray(weights, dtype=np.float64)
        if p.size < 2:
            return 0
        total = np.cumsum(p)[-1]  # std::accumulate: a left-to-right sum
        cp = np.cumsum(p / total)
        cp[-1] = 1.0
        return int(np.searchsorted(cp, self.canonical(), side="left"))


def log_softmax(scores: np.ndarray) -> np.ndarray:
    """genai's LogSoftMax (temperature 1), row-wise, float32."""
    s = scores - scores.max(axis=-1, keepdims=True)
    total = np.cumsum(np.exp(s), axis=-1, dtype=np.float32)[..., -1:]
    return (s - np.log(total)).astype(np.float32)


def _order(scores: np.ndarray) -> np.ndarray:
    return np.argsort(-scores, kind="stable")


class Sequences:
    """The tokens of every (batch x beam) row, preallocated to max_length."""

    def __init__(self, rows: int, max_length: int) -> None:
        self.tokens = np.zeros((rows, max_length), np.int32)
        self.length = 0
        self.max_length = max_length


class Search:
    """What greedy and beam search share: the sequences, the scores of the next step and the
    logits processors."""

    def __init__(self, params: dict, eos: list[int], pad: int, vocab: int) -> None:
        self.p = params
        self.batch = params["batch_size"]
        self.beams = params["num_beams"]
        self.rows = self.batch * self.beams
        self.eos = np.asarray(eos, dtype=np.int64)
        self.eos_set = {int(e) for e in eos}
        self.pad = pad
        self.vocab = vocab
        self.seq = Sequences(self.rows, params["max_length"])
        self.scores: np.ndarray | None = None  # (rows, vocab) float32
        self.next_tokens = np.zeros(self.rows, np.int32)

    @property
    def length(self) -> int:
        return self.seq.length

    def set_logits(self, logits: np.ndarray) -> None:
        self.scores = np.array(logits, dtype=np.float32).reshape(self.rows, -1)

    def apply_min_length(self) -> None:
        if self.seq.length < self.p["min_length"] and self.eos.size:
            self.scores[:, self.eos] = np.finfo(np.float32).min

    def apply_repetition_penalty(self) -> None:
        penalty = np.float32(self.p["repetition_penalty"])
        if penalty == 1.0:
            return
        for i in range(self.rows):
            ids = np.unique(self.sequence_row(i))
            s = self.scores[i, ids]
            self.scores[i, ids] = np.where(s < 0, s * penalty, s / penalty)

    def sequence_row(self, row: int) -> np.ndarray:
        return self.seq.tokens[row, :self.seq.length]


class GreedySearch(Search):
    def __init__(self, params: dict, eos: list[int], pad: int, vocab: int) -> None:
        super().__init__(params, eos, pad, vocab)
        seed = params["random_seed"]
        self.rng = MT19937(None if seed == -1 else seed)
        self.eos_seen = np.zeros(self.batch, bool)
        self.not_done = self.batch
        self.done = False

    def reset_done(self) -> None:
        self.done = False
        self.not_done = self.batch
        self.eos_seen[:] = False

    def _set_next(self, b: int, token: int) -> None:
        self.next_tokens[b] = token
        if token in self.eos_set:
            self.eos_seen[b] = True
            self.not_done -= 1
            if self.not_done == 0:
                self.done = True

    def _append_next(self) -> None:
        seq = self.seq
        seq.tokens[:, seq.length] = self.next_tokens
        seq.length += 1
        if seq.length == self.p["max_length"]:
            self.done = True

    def append_tokens(self, tokens: np.ndarray) -> None:
        """The user's tokens, (batch, n): appended column by column."""
        if self.seq.length + tokens.shape[1] > self.p["max_length"]:
            raise errors.InvalidArgument("User-defined tokens exceed max_length.")
        for j in range(tokens.shape[1]):
            for b in range(self.batch):
                self._set_next(b, int(tokens[b, j]))
            self._append_next()
        self.reset_done()

    def _choose(self, pick) -> None:
        for b in range(self.batch):
            if self.eos_seen[b]:
                self.next_tokens[b] = self.pad
                continue
            self._set_next(b, int(pick(self.scores[b])))
        if not self.done:
            self._append_next()

    def select_top(self) -> None:
        self._choose(np.ndarray.argmax)  # the first maximum, without np.argmax's dispatch

    def sample_top_k(self, k: int, temperature: float) -> None:
        self.sample_top_k_top_p(k, 0.0, temperature)

    def sample_top_p(self, p: float, temperature: float) -> None:
        inv_t = np.float32(1.0) / np.float32(temperature)
        p32 = np.float32(p)

        def pick(scores):
            # genai's FindNucleus: the shortest prefix (by score) whose float32 sum of
            # exp((s - max) / T) reaches p of itself plus a bound on the rest ((V - i - 1) times
            # the current term); with 64 tokens or fewer, p of the exact total instead
            idx = _order(scores)
            e = np.exp((scores[idx] - scores.max()) * inv_t).astype(np.float32)
            prefix = np.cumsum(e, dtype=np.float32)
            V = len(idx)
            if V <= 64:
                reach = np.nonzero(prefix >= p32 * prefix[-1])[0]
            else:
                tail = (np.arange(V - 1, -1, -1).astype(np.float32) * e).astype(np.float32)
                reach = np.nonzero(prefix >= p32 * (prefix + tail).astype(np.float32))[0]
            cut = int(reach[0]) + 1 if reach.size else V
            probs = e[:cut] * (np.float32(1.0) / prefix[cut - 1])
            return idx[self.rng.discrete(probs.astype(np.float32))]
        self._choose(pick)

    def sample_top_k_top_p(self, k: int, p: float, temperature: float) -> None:
        """The k best, their probabilities exp((s - max) / T) over their float32 sum, cut to the
        shortest prefix reaching p when 0 < p < 1, renormalised (genai's
        ComputeSampledCategorical)."""
        inv_t = np.float32(1.0) / np.float32(temperature)
        p32 = np.float32(p)

        def pick(scores):
            idx = _order(scores)[:k]
            e = np.exp((scores[idx] - scores[idx[0]]) * inv_t).astype(np.float32)
            probs = (e / np.cumsum(e, dtype=np.float32)[-1]).astype(np.float32)
            keep = len(idx)
            if 0.0 < p32 < 1.0:
                reach = np.nonzero(np.cumsum(probs, dtype=np.float32) >= p32)[0]
                keep = int(reach[0]) + 1 if reach.size else keep
            total = np.cumsum(probs[:keep], dtype=np.float32)[-1]
            return idx[self.rng.discrete(probs[:keep] * (np.float32(1.0) / total))]
        self._choose(pick)

    def is_done(self) -> bool:
        return self.done

    def next_indices(self) -> np.ndarray | None:
        return None

    def get_sequence(self, index: int) -> np.ndarray:
        if not 0 <= index < self.rows:
            raise errors.InvalidArgument(f"sequence index {index} out of range [0, {self.rows})")
        return self.sequence_row(index).copy()

    def rewind_to(self, length: int) -> None:
        self.reset_done()
        if length > 0:
            self.next_tokens[:] = self.seq.tokens[:, length]  # as genai: the token at `length`
        else:
            self.next_tokens[:] = 0
        self.seq.length = length


class _Hypotheses:
    """The finished beams of one batch entry, best first (genai's BeamHypotheses)."""

    def __init__(self, size: int, length_penalty: float) -> None:
        self.size = size
        self.penalty = np.float32(length_penalty)
        self.beams: list[tuple[float, np.ndarray]] = []
        self.done = False

    def _score(self, sum_logprobs: float, length: int) -> np.float32:
        return np.float32(sum_logprobs) / np.power(np.float32(length), self.penalty,
                                                   dtype=np.float32)

    def add(self, tokens: np.ndarray, sum_logprobs: float) -> None:
        score = self._score(sum_logprobs, len(tokens))
        if len(self.beams) == self.size:
            if score <= self.beams[-1][0]:
                return
            self.beams.pop()
        at = len(self.beams)
        while at > 0 and score > self.beams[at - 1][0]:
            at -= 1
        self.beams.insert(at, (score, tokens.copy()))

    def can_improve(self, best_sum_logprobs: float, length: int) -> bool:
        return self.beams[-1][0] < self._score(best_sum_logprobs, length)


class BeamSearch(Search):
    def __init__(self, params: dict, eos: list[int], pad: int, vocab: int) -> None:
        super().__init__(params, eos, pad, vocab)
        n = self.beams
        self.hyps = [_Hypotheses(n, params["length_penalty"]) for _ in range(self.batch)]
        self.beam_scores = np.zeros(self.rows, np.float32)
        self.beam_scores.reshape(self.batch, n)[:, 1:] = -1e9  # only beam 0 starts
        self.beam_indices = np.arange(self.rows, dtype=np.int32)
        self.not_done = self.batch
        self.finalized = False

    def append_tokens(self, tokens: np.ndarray) -> None:
        n = tokens.shape[1]
        if self.seq.length + n > self.p["max_length"]:
            raise errors.InvalidArgument("User-defined tokens exceed max_length.")
        rows = np.repeat(tokens, self.beams, axis=0)
        self.seq.tokens[:, self.seq.length:self.seq.length + n] = rows
        self.seq.length += n
        self.next_tokens = rows[:, -1].astype(np.int32)

    def select_top(self) -> None:
        n, V = self.beams, self.scores.shape[1]
        scores = log_softmax(self.scores) + self.beam_scores[:, None]
        top_k = 2 * n
        new_scores = np.zeros(self.rows, np.float32)
        new_tokens = np.zeros(self.rows, np.int32)
        new_indices = np.zeros(self.rows, np.int32)
        length = self.seq.length
        # the 2 num_beams best (score, row-major index) of each batch entry, over all its beams
        flats = scores.reshape(self.batch, n * V)
        cands = [_order(f)[:top_k] for f in flats]
        cand_scores = np.concatenate([f[c] for f, c in zip(flats, cands, strict=True)])
        for b in range(self.batch):
            hyp = self.hyps[b]
            lo = b * n
            if hyp.done:
                new_tokens[lo:lo + n] = self.pad
                continue
            flat = flats[b]
            beam = 0
            for j, c in enumerate(cands[b]):
                token, src, score = int(c % V), lo + int(c // V), flat[c]
                if token in self.eos_set:
                    if j >= n:
                        continue
                    hyp.add(self.seq.tokens[src, :length], score)
                else:
                    new_scores[lo + beam], new_tokens[lo + beam] = score, token
                    new_indices[lo + beam] = src
                    beam += 1
                if beam == n:
                    break
            if len(hyp.beams) < n:
                continue
            if not self.p["early_stopping"]:
                # as genai: the best of the candidates read from offset b * num_beams
                best = float(np.max(cand_scores[lo:lo + top_k]))
                if hyp.can_improve(best, length):
                    continue
            hyp.done = True
            self.not_done -= 1
        self.beam_scores, self.next_tokens, self.beam_indices = new_scores, new_tokens, new_indices
        seq = self.seq
        seq.tokens[:, :length] = seq.tokens[new_indices, :length]
        seq.tokens[:, length] = new_tokens
        seq.length += 1

    def is_done(self) -> bool:
        return self.not_done == 0 or self.seq.length == self.p["max_length"]

    def next_indices(self) -> np.ndarray | None:
        return self.beam_indices

    def _finalize(self) -> None:
        if self.finalized:
            return
        for b, hyp in enumerate(self.hyps):
            if hyp.done:
                continue
            for k in range(self.beams):
                row = b * self.beams + k
                hyp.add(self.sequence_row(row), float(self.beam_scores[row]))
        self.finalized = True

    def get_sequence(self, index: int) -> np.ndarray:
        nrs = self.p["num_return_sequences"]
        if not 0 <= index < self.batch * nrs:
            raise errors.InvalidArgument(
                f"sequence index {index} out of range [0, {self.batch * nrs})")
        self._finalize()
        return self.hyps[index // nrs].beams[index % nrs][1].copy()

    def rewind_to(self, length: int) -> None:
        raise errors.InvalidArgument("RewindTo is not supported with beam search")
