"""The ``onnxrun`` command line.

``onnxrun info MODEL``
    Describe a model without running it: producer, IR version, opsets, inputs and outputs, the
    initializers' count and size, and how many nodes of each operator it holds.

``onnxrun run MODEL [--input NAME=FILE ...] [--dim NAME=VALUE ...] [--output-dir DIR] [-r N]``
    Run a model once on the inputs given (``.npy`` or ``.pb`` TensorProto files) and on random
    inputs for the others, print a summary of every output, and time the first run and the median
    of ``N`` more. Symbolic and unknown dimensions are 1 unless ``--dim`` names them.

``onnxrun bench MODEL [--vs onnxruntime] [-r N | -m SECONDS] [-x N] [--profile] ...``
    Time a model (median, p90, min, runs/s, creation time, peak memory), alternately with
    onnxruntime when asked; see ``onnxrun.tools.bench``.

``onnxrun optimize MODEL -o OUT [--level basic|extended|all|disable] [--check]``
    Optimize a model as a session would at that level, save it, and print what each pass
    changed and the node counts before and after; see ``onnxrun.tools.optimize``.

``onnxrun quantize MODEL -o OUT [--static --calibration-dir DIR] [--format qdq|qoperator]``
    Quantize a model to 8 bits (dynamic by default; static with calibration inputs) and print
    the size and operator changes; see ``onnxrun.tools.quantize``.

``onnxrun serve MODEL_REPOSITORY [--http-port 8000] [--host 127.0.0.1]``
    Serve a Triton-style model repository (or one ``.onnx``) on the KServe v2 inference protocol
    over HTTP, with Triton's dynamic batcher; see ``onnxrun.serve``.

``onnxrun generate MODEL_DIR -p PROMPT [-n N] [--do-sample --top-k K --seed S] [--num-beams B]``
    Generate text with an onnxruntime-genai model folder (onnxrun.genai): the answer streams to
    stdout, prompt and decode tokens/s to stderr; see ``onnxrun.tools.generate``.

Each command is a module of this package (``quantize`` included) with ``add_parser`` and its
``cmd_*`` function; what they share lives in ``onnxrun.tools.common``. This module only builds
the parser and dispatches.

Errors (a missing file, a malformed model, an input that does not fit) are reported on one line
and exit with status 1; ``--traceback`` shows the Python traceback instead.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .._version import __version__
from ..errors import OnnxRunError
from . import bench, generate, info, optimize, quantize, run, serve
from .common import PROG, CliError, one_line

# each adds its subcommand, in this order
COMMANDS = (info, run, bench, optimize, quantize, serve, generate)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="onnxrun: run and inspect ONNX models (an onnxruntime in Python)."
    )
    parser.add_argument("--traceback", action="store_true",
                        help="show the Python traceback of an error instead of one line")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # --traceback also after the command; SUPPRESS keeps the subparser from resetting it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--traceback", action="store_true", default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS)
    for command in COMMANDS:
        command.add_parser(sub, [common])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "repeat", 0) < 0:
        parser.error("-r/--repeat must be >= 0")
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except (CliError, OnnxRunError, OSError, ValueError, TypeError) as e:
        if args.traceback:
            raise
        print(f"{PROG}: error: {one_line(e)}", file=sys.stderr)
        return 1
    except Exception as e:  # a bug: still one line, with the way to see more
        if args.traceback:
            raise
        print(f"{PROG}: internal error: {type(e).__name__}: {one_line(e)} "
              "(rerun with --traceback for details)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
