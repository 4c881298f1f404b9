"""The compiler process: LLVM IR in, an ELF object for this CPU out (run by jit.py).

It runs in a child process so that the engine's own process never loads LLVM: importing
llvmlite and compiling costs 60-80 MB of resident memory that would stay for the life of the
process, more than an int8 model saves. Protocol: one JSON request on stdin
(``{"modules": {name: {"ir": text, "requires": [features]}}}``), one JSON answer on stdout
(``{"features": [...], "error": text or null, "objects": {name: base64}, "errors": {name:
text}}``); ``error`` is about the compiler itself (no llvmlite), ``errors`` about one module.
"""

from __future__ import annotations

import base64
import json
import sys


def main() -> None:
    request = json.loads(sys.stdin.read())
    answer = {"features": [], "error": None, "objects": {}, "errors": {}}
    try:
        import llvmlite.binding as llvm

        try:  # llvmlite < 0.45 needs an explicit initialize(); newer ones refuse it
            llvm.initialize()
        except RuntimeError:
            pass
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        features = llvm.get_host_cpu_features()
        answer["features"] = sorted(k for k, v in features.items() if v)
        target = llvm.Target.from_default_triple()
        # position-independent code: jit.py copies it to memory of its own choosing
        tm = target.create_target_machine(cpu=llvm.get_host_cpu_name(),
                                          features=features.flatten(), opt=3, reloc="pic",
                                          codemodel="small")
    except Exception as exc:  # ImportError (no llvmlite), or a host LLVM cannot target
        answer["error"] = f"{type(exc).__name__}: {exc}"
        sys.stdout.write(json.dumps(answer))
        return
    for name, module in request.get("modules", {}).items():
        missing = sorted(set(module.get("requires", ())) - set(answer["features"]))
        if missing:
            answer["errors"][name] = f"the CPU lacks {', '.join(missing)}"
            continue
        try:
            parsed = llvm.parse_assembly(module["ir"])
            parsed.verify()
            answer["objects"][name] = base64.b64encode(tm.emit_object(parsed)).decode()
        except Exception as exc:  # IR that LLVM refuses: reported, the others still compile
            answer["errors"][name] = f"{type(exc).__name__}: {exc}"
    sys.stdout.write(json.dumps(answer))


if __name__ == "__main__":
    main()
