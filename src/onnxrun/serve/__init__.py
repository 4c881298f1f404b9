"""``onnxrun serve``: a model server on the KServe v2 / Triton inference protocol.

The core knows nothing of HTTP: ``repository.py`` finds and loads the models of a Triton-style
model repository (``<name>/<version>/model.onnx`` with an optional ``config.pbtxt``), and
``scheduler.py`` is each model's dynamic batcher, which runs requests (dicts of numpy arrays) on
the model's instances. ``http.py`` is the REST endpoint: it only translates the protocol into
core calls (it needs the optional extra ``pip install "onnxrun[serve]"``).
"""
