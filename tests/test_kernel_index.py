"""CPU kernel modules are imported on demand (providers/cpu/ops/__init__.py's KERNEL_MODULES):
the table names, for every operator, the modules that register it; a session imports only the
families its model uses, and the registry it sees is the one importing everything gives.

Each check runs in a fresh interpreter: kernel modules imported by earlier tests would hide what
an import registers, or that a module was not imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from onnxrun.providers.registry import KernelRegistry


def _run(code: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# Records which module calls the registry's decorator for each (domain, op_type, version).
_RECORD_REGISTRATIONS = """
    import collections, json, sys
    from onnxrun.providers import registry
    assert "onnxrun.providers.cpu.kernels" not in sys.modules
    register = registry.KernelRegistry.register
    seen = collections.defaultdict(set)

    def recording(self, op_type, *versions, domain=""):
        module = sys._getframe(1).f_globals["__name__"]
        for v in versions or (1,):
            seen[("" if domain == "ai.onnx" else domain, op_type, v)].add(module)
        return register(self, op_type, *versions, domain=domain)

    registry.KernelRegistry.register = recording
    from onnxrun.providers.cpu import ops
    ops.import_all()
"""


def _format_table(by_domain: dict[str, dict[str, list[str]]]) -> str:
    """KERNEL_MODULES as it should read (to paste when the modules change)."""
    lines = ["KERNEL_MODULES: dict[str, dict[str, tuple[str, ...]]] = {"]
    for domain in sorted(by_domain):
        lines.append(f'    "{domain}": {{')
        for module in sorted(by_domain[domain]):
            names = sorted(by_domain[domain][module])
            body = ", ".join(f'"{n}"' for n in names) + ("," if len(names) == 1 else "") + "),"
            head = f'        "{module}": ('
            if len(head) + len(body) <= 100:
                lines.append(head + body)
            else:
                lines.append(head)
                lines += ["            " + w for w in textwrap.wrap(
                    body, width=88, break_long_words=False, break_on_hyphens=False)]
        lines.append("    },")
    return "\n".join([*lines, "}"])


def test_table_lists_what_each_module_registers():
    got = _run(_RECORD_REGISTRATIONS + """
    prefix = ops.__name__ + "."
    by_domain = collections.defaultdict(lambda: collections.defaultdict(set))
    for (domain, op_type, _), modules in seen.items():
        for m in modules:
            by_domain[domain][m[len(prefix):]].add(op_type)
    twice = sorted(f"{k}: {sorted(m)}" for k, m in seen.items() if len(m) > 1)
    print(json.dumps({
        "registered": {d: {m: sorted(o) for m, o in ms.items()} for d, ms in by_domain.items()},
        "twice": twice,
    }))
    """)
    from onnxrun.providers.cpu.ops import KERNEL_MODULES

    table = {d: {m: sorted(ops) for m, ops in ms.items()} for d, ms in KERNEL_MODULES.items()}
    assert table == got["registered"], (
        "providers/cpu/ops/__init__.py's KERNEL_MODULES is out of date; it should read:\n"
        + _format_table(got["registered"]))
    # One module per (operator, version): then the order modules load in cannot matter.
    assert not got["twice"]


def test_lazy_registry_equals_the_eager_one():
    """Looking operators up one by one (imports by the table) ends with the same kernels as
    importing every module first."""
    lazy = _run("""
        import json
        from onnxrun.providers.cpu import cpu_kernels, ops
        keys = sorted(ops.modules_by_operator(), reverse=True)
        for domain, op_type in keys:
            assert cpu_kernels.lookup(domain, op_type, 1000) is not None, (domain, op_type)
        assert cpu_kernels._import_rest is not None  # every lookup was served by the table
        print(json.dumps([[d, o, v, cpu_kernels.lookup(d, o, v).impl.__qualname__]
                          for d, o, v in cpu_kernels.operators()]))
    """)
    eager = _run("""
        import json
        from onnxrun.providers.cpu import _load_kernels, cpu_kernels
        _load_kernels()
        print(json.dumps([[d, o, v, cpu_kernels.lookup(d, o, v).impl.__qualname__]
                          for d, o, v in cpu_kernels.operators()]))
    """)
    assert lazy == eager


def test_session_imports_only_the_families_it_uses():
    got = _run("""
        import json, sys
        import onnx
        import onnxrun
        m = onnx.parser.parse_model('''
            <ir_version: 8, opset_import: ["": 17]>
            g (float[2, 3] x) => (float[2, 3] y) { y = Relu(x) }
        ''')
        onnxrun.InferenceSession(m.SerializeToString())
        print(json.dumps(sorted(n for n in sys.modules if ".cpu.ops." in n)))
    """)
    families = {name.split(".cpu.ops.", 1)[1] for name in got}
    assert "activation" in families
    assert not families & {"image", "rnn", "text", "ml.tree", "contrib.transformer", "signal"}


def test_custom_kernel_overrides_a_builtin_not_yet_imported():
    got = _run("""
        import json
        import numpy as np
        import onnxrun
        from onnxrun.providers.cpu import cpu_kernels

        @onnxrun.register_custom_op("FastGelu", "com.microsoft")
        def custom_fast_gelu(X, bias=None):
            return X + 100

        kdef = cpu_kernels.lookup("com.microsoft", "FastGelu", 1)
        cpu_kernels.operators()  # every module imported now: the custom kernel still wins
        again = cpu_kernels.lookup("com.microsoft", "FastGelu", 1)
        print(json.dumps([kdef.impl.__name__, again.impl.__name__]))
    """)
    assert got == ["custom_fast_gelu", "custom_fast_gelu"]


def test_operator_missing_from_the_table_is_still_found():
    registry = KernelRegistry("test")
    imported = []

    def import_all() -> None:
        imported.append(True)
        registry.register("Late", 1, domain="test.domain")(lambda X: X)

    registry.defer({}, import_all)
    assert registry.lookup("test.domain", "Late", 1) is not None
    assert registry.lookup("test.domain", "Unknown", 1) is None
    assert imported == [True]  # imported everything once


def test_sessions_created_on_threads_at_once_find_every_kernel():
    """First lookups from several threads: a thread waits for a module another is importing."""
    code = """
        import json, threading
        import numpy as np, onnx, onnxrun
        m = onnx.parser.parse_model('''
            <ir_version: 8, opset_import: ["": 17]>
            g (float[4, 4] x) => (float[4, 4] y) {
                a = Relu(x)
                b = Sigmoid(a)
                c = MatMul(b, x)
                y = Transpose(c)
            }
        ''').SerializeToString()
        x = np.eye(4, dtype=np.float32)
        results, errors = [], []
        def work():
            try:
                results.append(onnxrun.InferenceSession(m).run(None, {"x": x})[0].tolist())
            except Exception as e:
                errors.append(repr(e))
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads: t.start()
        for t in threads: t.join()
        print(json.dumps({"errors": errors, "same": all(r == results[0] for r in results),
                          "n": len(results)}))
    """
    got = _run(code)
    assert got == {"errors": [], "same": True, "n": 4}


def test_attribute_params_read_off_the_code_match_the_signatures():
    """Every registered kernel's attributes (keyword-only parameters and defaults), read off
    its code object, are what inspect.signature gives, including a wrapped function's."""
    import functools
    import inspect

    from onnxrun.providers import registry
    from onnxrun.providers.cpu import CPUExecutionProvider

    def by_signature(impl, is_class):
        sig = inspect.signature(impl.__init__ if is_class else impl)
        params = {p.name: p.default for p in sig.parameters.values()
                  if p.kind is inspect.Parameter.KEYWORD_ONLY}
        if not is_class and getattr(impl, "accepts_out", False):
            params.pop("out")  # registry.takes_out: the executor's buffer, not an attribute
        return params

    reg = CPUExecutionProvider().registry
    reg.import_all()
    defs = {id(d.impl): d for ds in reg._defs.values() for d in ds}
    assert len(defs) > 300
    for d in defs.values():
        assert registry._attribute_params(d.impl, d.is_class) == \
            by_signature(d.impl, d.is_class), d.op_type

    def kernel(x, *, axis=1, mode):
        return x

    @functools.wraps(kernel)
    def wrapped(x, *args, **kwargs):
        return kernel(x, *args, **kwargs)

    assert registry._attribute_params(kernel, False) == {"axis": 1, "mode": registry.REQUIRED}
    assert registry._attribute_params(wrapped, False) == {"axis": 1, "mode": registry.REQUIRED}
