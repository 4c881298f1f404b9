"""The instruction sets the compiled kernels are generated for, and which one this host runs.

A ``Target`` names a CPU level the compiler process compiles for explicitly (an LLVM CPU and
feature list, not the host's own): an object compiled for ``avx2`` runs on every CPU with
AVX2+FMA, whatever machine compiled it. Kernel generators read the target (``lanes``,
``has("avx512vnni")``) and emit IR for it; the loader (jit.py) takes the best target the
host supports, or the one named by ``ONNXRUN_COMPILED_TARGET`` / ``jit.forced_target``.

Only x86-64 Linux is handled: the objects are x86-64 ELF, called with the System V ABI, and
mapped with Linux's mmap. Elsewhere (ARM, Windows, macOS) ``select`` gives the reason and
the kernels keep their numpy path.
"""

from __future__ import annotations

import collections
import functools
import platform
import sys

TRIPLE = "x86_64-unknown-linux-gnu"
ENV = "ONNXRUN_COMPILED_TARGET"

# What LLVM's x86-64-v3 / -v4 CPU levels enable (each is required of the host, since LLVM may
# use any of them), in LLVM's feature names.
_V3 = ("sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "cx16", "sahf", "avx", "avx2", "bmi",
       "bmi2", "f16c", "fma", "lzcnt", "movbe", "xsave")
_V4 = _V3 + ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")


# A collections.namedtuple, not typing.NamedTuple (its string annotations are each compiled
# into a ForwardRef: ~1 ms of a first session, as a frozen dataclass was).
class Target(collections.namedtuple("Target", "name cpu features extra lanes")):
    """One instruction set the kernels are compiled for: ``name`` (str), ``cpu`` (str),
    ``features`` and ``extra`` (tuples of str), ``lanes`` (int).

    ``cpu`` and ``extra`` are what the compiler is given (an LLVM CPU level and features
    beyond it); ``features`` is everything the code may use, all of which the host must have.
    ``lanes`` is the number of float32 (or int32) lanes of the target's vector registers.
    """

    __slots__ = ()
    name: str
    cpu: str
    features: tuple[str, ...]
    extra: tuple[str, ...]
    lanes: int

    def has(self, feature: str) -> bool:
        return feature in self.features

    @property
    def identity(self) -> str:
        """What an object compiled for this target depends on besides its IR (cache keys)."""
        return f"{self.name}|{TRIPLE}|{self.cpu}|{','.join(self.features)}"


def _target(name: str, level: tuple[str, ...], cpu: str, extra: tuple[str, ...],
            lanes: int) -> Target:
    return Target(name, cpu, tuple(sorted(set(level) | set(extra))), extra, lanes)


# best first: the loader takes the first one the host supports
TARGETS = (
    _target("avx512vnni", _V4, "x86-64-v4", ("avx512vnni",), 16),
    _target("avx512", _V4, "x86-64-v4", (), 16),
    _target("avxvnni", _V3, "x86-64-v3", ("avxvnni",), 8),
    _target("avx2", _V3, "x86-64-v3", (), 8),
)
_BY_NAME = {t.name: t for t in TARGETS}

# /proc/cpuinfo's flag names where LLVM's differ
_CPUINFO_NAMES = {"pni": "sse3", "sse4_1": "sse4.1", "sse4_2": "sse4.2", "lahf_lm": "sahf",
                  "bmi1": "bmi", "abm": "lzcnt", "avx512_vnni": "avx512vnni",
                  "avx_vnni": "avxvnni"}


def get(name: str) -> Target:
    """The target called ``name``; ValueError naming the known ones otherwise."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"{name!r} is not a compiled-kernel target (known: "
                         f"{', '.join(_BY_NAME)})") from None


def _cpuinfo_flags() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            head = f.read(1 << 16).split("\n\n", 1)[0]
    except OSError:
        return None
    for line in head.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return value
    return None


@functools.cache
def host_features() -> frozenset[str]:
    """The host CPU's features in LLVM's names, from Linux's /proc/cpuinfo (whose flags the
    kernel clears for register states the OS does not save); empty where unreadable."""
    flags = _cpuinfo_flags()
    if flags is None:
        return frozenset()
    return frozenset(_CPUINFO_NAMES.get(f, f) for f in flags.split())


def host_platform() -> tuple[str, str]:
    """(sys.platform, machine), what the loader depends on (a function: tests fake a host)."""
    return sys.platform, platform.machine().lower()


def why_not_host() -> str | None:
    """Why this host cannot load the kernels' objects at all, or None."""
    system, machine = host_platform()
    if machine not in ("x86_64", "amd64"):
        return f"the compiled kernels are x86-64 code; this host is {machine or 'unknown'}"
    if not system.startswith("linux"):
        return f"the compiled-kernel loader handles Linux only; this host is {system}"
    return None


def select(name: str | None = None) -> tuple[Target | None, str | None]:
    """(the target to run, None), or (None, why none): the one called ``name`` if given (it
    must be one the host supports), else the best the host supports."""
    reason = why_not_host()
    if reason:
        return None, reason
    host = host_features()
    if not host:
        return None, "the CPU's features cannot be read (/proc/cpuinfo)"
    if name:
        try:
            target = get(name)
        except ValueError as exc:
            return None, str(exc)
        missing = sorted(set(target.features) - host)
        if missing:
            return None, f"the CPU lacks {', '.join(missing)} (target {name})"
        return target, None
    for target in TARGETS:
        if host.issuperset(target.features):
            return target, None
    return None, "the CPU lacks AVX2 and FMA (the least the compiled kernels need)"


__all__ = ["ENV", "TARGETS", "TRIPLE", "Target", "get", "host_features", "host_platform",
           "select", "why_not_host"]
