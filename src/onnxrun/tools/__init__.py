"""The ``onnxrun`` command line: ``cli.py`` dispatches to one module per subcommand; what
they share is in ``common.py``."""
