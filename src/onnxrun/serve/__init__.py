"""``onnxrun serve``: a model server on the KServe v2 / Triton inference protocol.

The core knows nothing of HTTP: ``repository.py`` finds and loads the models of a Triton-style
model repository (``<name>/<version>/model.onnx`` with an optional ``config.pbtxt``), and
``scheduler.py`` is each model's dynamic batcher, which runs requests (dicts of numpy arrays) on
the model's instances. ``http.py`` (REST) and ``grpc.py`` (gRPC) are the endpoints: they only
translate the protocol into core calls; ``describe.py`` is what both say about the models, and
``server.py`` runs them in one process (the optional extra ``pip install "onnxrun[serve]"``).
"""
