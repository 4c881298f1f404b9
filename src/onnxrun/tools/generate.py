"""``onnxrun generate MODEL_DIR -p PROMPT``: text generation from an onnxruntime-genai model folder.

The answer streams to stdout as it is decoded; the figures (prompt tokens and their tokens/s,
new tokens and the decode tokens/s) go to stderr at the end, and while it runs a progress line
on stderr (only on a terminal, cut to its width). Several ``-p`` make a batch (right-padded, as
onnxruntime-genai pads it); a batch or a beam search prints its sequences at the end.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from typing import Any, TextIO

from .common import CliError


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = sub.add_parser("generate", parents=parents,
                       help="generate text with an onnxruntime-genai model folder")
    p.add_argument("model", help="model folder (genai_config.json, model.onnx, tokenizer.json)")
    p.add_argument("-p", "--prompt", action="append", required=True,
                   help="the prompt (repeat for a batch)")
    p.add_argument("-n", "--max-new-tokens", type=int, default=128,
                   help="tokens to generate after the longest prompt (default 128)")
    p.add_argument("--max-length", type=int, default=None,
                   help="total length, prompt included (instead of --max-new-tokens)")
    p.add_argument("--min-length", type=int, default=None)
    p.add_argument("--do-sample", action="store_true", help="sample instead of greedy search")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--seed", type=int, default=None, help="random_seed of the sampler")
    p.add_argument("--repetition-penalty", type=float, default=None)
    p.add_argument("--num-beams", type=int, default=None)
    p.add_argument("--threads", type=int, default=None,
                   help="intra-op threads of the decoder session (default: all cores)")
    p.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    p.set_defaults(func=cmd_generate)
    return p


def _search_options(args: argparse.Namespace, longest: int) -> dict[str, Any]:
    if args.max_new_tokens < 1:
        raise CliError("--max-new-tokens must be at least 1")
    opts: dict[str, Any] = {
        "max_length": args.max_length or longest + args.max_new_tokens,
        "batch_size": len(args.prompt),
    }
    if opts["max_length"] <= longest:
        raise CliError(f"--max-length {opts['max_length']} leaves no room after the prompt "
                       f"({longest} tokens)")
    for name in ("min_length", "top_k", "top_p", "temperature", "repetition_penalty",
                 "num_beams"):
        value = getattr(args, name)
        if value is not None:
            opts[name] = value
    if args.do_sample:
        opts["do_sample"] = True
    if args.seed is not None:
        opts["random_seed"] = args.seed
    return opts


class _Progress:
    """One status line on a terminal's stderr, redrawn in place and cut to its width."""

    def __init__(self, stream: TextIO, enabled: bool) -> None:
        self.stream = stream
        self.enabled = enabled and stream.isatty()

    def show(self, text: str) -> None:
        if self.enabled:
            width = shutil.get_terminal_size((80, 24)).columns - 1
            self.stream.write("\r\x1b[K" + text[:width])
            self.stream.flush()

    def clear(self) -> None:
        if self.enabled:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def cmd_generate(args: argparse.Namespace, out: TextIO | None = None,
                 err: TextIO | None = None) -> int:
    from .. import genai  # noqa: PLC0415 - the tokenizers import only for this command

    out = out or sys.stdout
    err = err or sys.stderr
    config = genai.Config(args.model)
    if args.threads is not None:
        if args.threads < 0:
            raise CliError("--threads must be >= 0")
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {
            "intra_op_num_threads": args.threads}}}}))
    t0 = time.perf_counter()
    model = genai.Model(config)
    tokenizer = genai.Tokenizer(model)
    load_s = time.perf_counter() - t0
    batch = len(args.prompt)
    ids = tokenizer.encode_batch(args.prompt).as_numpy()
    lengths = [len(tokenizer.encode(p)) for p in args.prompt]
    params = genai.GeneratorParams(model)
    params.set_search_options(**_search_options(args, ids.shape[1]))
    generator = genai.Generator(model, params)
    beams = params.search["num_beams"]
    stream = tokenizer.create_stream() if batch == 1 and beams == 1 else None
    progress = _Progress(err, not args.no_progress)
    max_length = generator.params["max_length"]

    t0 = time.perf_counter()
    generator.append_tokens(ids)
    prompt_s = time.perf_counter() - t0
    steps = 0
    t0 = time.perf_counter()
    try:
        while not generator.is_done():
            generator.generate_next_token()
            steps += 1
            if stream is not None:
                piece = stream.decode(int(generator.get_next_tokens()[0]))
                if piece:
                    progress.clear()
                    out.write(piece)
                    out.flush()
            elapsed = time.perf_counter() - t0
            progress.show(f"[{generator.token_count()}/{max_length} tokens, "
                          f"{steps / elapsed if elapsed else 0.0:.1f} tokens/s]")
    except KeyboardInterrupt:
        progress.clear()
        err.write("\n(interrupted)\n")
    decode_s = time.perf_counter() - t0
    progress.clear()
    if stream is not None:
        out.write("\n")
    else:
        rows = batch * (params.search["num_return_sequences"] if beams > 1 else 1)
        for i in range(rows):
            seq = generator.get_sequence(i)
            start = ids.shape[1]
            out.write(f"[{i}] {tokenizer.decode(seq[start:])}\n")
    out.flush()
    n_prompt = sum(lengths)
    err.write(f"load: {load_s:.2f} s | prompt: {n_prompt} tokens in {prompt_s * 1e3:.1f} ms "
              f"({n_prompt / prompt_s if prompt_s else 0.0:.1f} tokens/s) | decode: "
              f"{steps * batch} tokens in {decode_s:.2f} s "
              f"({steps * batch / decode_s if decode_s else 0.0:.1f} tokens/s)\n")
    return 0
