"""``python -m onnxrun``: the ``onnxrun`` command line."""

from __future__ import annotations

from .tools.cli import main

raise SystemExit(main())
