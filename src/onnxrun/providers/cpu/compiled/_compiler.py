"""The compiler process: LLVM IR in, an x86-64 ELF object for a named target out (run by jit.py).

It runs in a child process so that the engine's own process never loads LLVM: importing
llvmlite and compiling costs 60-80 MB of resident memory that would stay for the life of the
process, more than an int8 model saves. Protocol: one JSON request on stdin (``{"target":
{"triple": ..., "cpu": ..., "features": [...]}, "modules": {name: ir}}``: the target's LLVM
CPU level and features, given explicitly so that the object is the same whichever CPU
compiles it), one JSON answer on stdout (``{"error": text or null, "objects": {name: base64},
"errors": {name: text}}``); ``error`` is about the compiler itself (no llvmlite, a target LLVM
cannot make), ``errors`` about one module.

Modules are compiled as written (the code generator's optimizations only), except that a
module whose text starts with ``INLINE`` has its ``alwaysinline`` functions inlined first.
"""

from __future__ import annotations

import base64
import json
import sys

# The first line of a module whose alwaysinline functions are to be inlined (the float GEMM's
# tiles: a call per tile, with its 18 arguments, was 5-25% of a small-K product). Opt-in per
# module: the others' objects stay what they were.
INLINE = "; onnxrun: inline alwaysinline functions\n"


def main() -> None:
    request = json.loads(sys.stdin.read())
    answer = {"error": None, "objects": {}, "errors": {}}
    try:
        import llvmlite.binding as llvm

        try:  # llvmlite < 0.45 needs an explicit initialize(); newer ones refuse it
            llvm.initialize()
        except RuntimeError:
            pass
        llvm.initialize_native_target()  # jit.py starts a compiler on x86-64 hosts only
        llvm.initialize_native_asmprinter()
        llvm.initialize_native_asmparser()  # inline assembly (spin.py's sched_yield)
        target = request["target"]
        # position-independent code: jit.py copies it to memory of its own choosing
        tm = llvm.Target.from_triple(target["triple"]).create_target_machine(
            cpu=target["cpu"], features=",".join(f"+{f}" for f in target["features"]),
            opt=3, reloc="pic", codemodel="small")
    except Exception as exc:  # ImportError (no llvmlite), or a target this LLVM cannot make
        answer["error"] = f"{type(exc).__name__}: {exc}"
        sys.stdout.write(json.dumps(answer))
        return
    for name, ir in request.get("modules", {}).items():
        try:
            parsed = llvm.parse_assembly(ir)
            parsed.triple = target["triple"]
            parsed.verify()
            if ir.startswith(INLINE):  # its alwaysinline functions inlined (no other pass)
                passes = llvm.create_new_module_pass_manager()
                passes.add_always_inliner_pass()
                passes.run(parsed, llvm.create_pass_builder(
                    tm, llvm.create_pipeline_tuning_options()))
            answer["objects"][name] = base64.b64encode(tm.emit_object(parsed)).decode()
        except Exception as exc:  # IR that LLVM refuses: reported, the others still compile
            answer["errors"][name] = f"{type(exc).__name__}: {exc}"
    sys.stdout.write(json.dumps(answer))


if __name__ == "__main__":
    main()
