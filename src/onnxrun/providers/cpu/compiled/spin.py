"""Spinning workers for compiled kernels: one product split over threads with a hand-off of a
few hundred nanoseconds instead of parallel.py's queue wake (20-80 us on a virtual machine).

An LLM's decode step is a chain of products of 30-300 us each (issue #14): waking a sleeping
thread for each costs as much as the half of the work it takes over. So each worker, once
woken, waits for its next piece in compiled code (no GIL held), polling one word of its own
for up to ``SPIN_TICKS``, and only then sleeps, on that word (a futex), still in compiled
code: a worker never takes the GIL once started. A kernel hands
out work as a compiled job function ``void job(ptr args)`` and one argument block per part
(``fork``): the calling thread runs part 0 and takes back any part no worker has begun yet
(a worker the OS has not scheduled costs a wait of nothing, as in parallel._Job), so a
``fork`` always finishes and never waits for a sleeping thread.

Each worker's control word (``state``): 0 asleep, 1 spinning, 3 claimed by a caller (the
caller writes the job), 2 job posted, 4 job running. Only a caller moves 1 -> 3 -> 2 and
2 -> 3 -> 1 (taking a part back); only the worker moves 2 -> 4 -> 1 and 1 -> 0. Words
[1-4]: job function, argument block, the job's sequence number, the last finished one (the
caller waits for its number, never for the state: the worker may have been claimed again).
A caller also posts to a worker asleep (0 -> 3, a futex wake, -> 2): a large part is still the
worker's when it arrives; taken back, the word is 0 again, and a worker that finds 0 at the
end of its polling sleeps.
Several calling threads may fork at once: a worker someone else holds is simply not used.
``run_blocks`` hands out many ranges (the float GEMM's, Winograd's 16 products) by one fork:
every part runs @grab on one shared block, taking the next range until none is left.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from ..parallel import run_ranges, usable_cores
from . import jit
from .layout import aligned_zeros

REQUIRES = ()
# how long a worker polls for its next piece before sleeping; in time-stamp counter ticks
# (~1-3 GHz): about 1 ms, longer than the gaps between a decode step's products
SPIN_TICKS = 2_000_000
# 128 bytes per worker, from a 128-byte boundary, with a padding pair of lines before the
# first and after the last: nothing else shares a worker's cache lines (nor the line the
# adjacent-line prefetcher pairs with them). A worker polls its control word; at 64 bytes
# from numpy's 16-byte-aligned allocation the words straddled two lines shared with other
# heap objects (base % 64 = 32 seen), whose every write (a Python refcount) would pull the
# line off the polling core
_WORDS = 16
# After this many ticks (~20-50 us) of polling, a worker or a waiting caller yields its core
# (sched_yield) on each turn: on an idle machine the call returns at once, on a busy one
# (more runnable threads than cores) another thread runs instead of the polling. Measured on
# the 2-vCPU VM at load ~5: without it, 2 threads took longer than 1 (ResNet-50 0.73-0.99x).
YIELD_TICKS = 50_000
# Linux x86-64's sched_yield (system call 24), inline: the compiled objects link nothing
_YIELD = 'call i64 asm sideeffect "syscall", "={rax},{rax},~{rcx},~{r11},~{memory}"(i64 24)'
# futex(ctrl, op, 0, NULL) (system call 202) on the word's low half (little-endian; states
# 0-4): FUTEX_WAIT_PRIVATE sleeps while it reads 0, FUTEX_WAKE_PRIVATE wakes one sleeper.
# The worker sleeps and wakes in compiled code, never in Python: waking a Python thread on a
# threading.Event made it take the GIL twice (out of the wait, into the next poll), from the
# calling thread between its kernels (a GIL hand-off: 5-50 us on the VM, each time)
_FUTEX_WAIT, _FUTEX_WAKE = 128, 129
_FUTEX = ('%fx{op} = call i64 asm sideeffect "syscall", '
          '"={{rax}},{{rax}},{{rdi}},{{rsi}},{{rdx}},{{r10}},~{{rcx}},~{{r11}},~{{memory}}"'
          '(i64 202, ptr %ctrl, i64 {op}, i64 {val}, i64 0)')


def module_ir(target=None) -> str:
    cas = "cmpxchg ptr {p}, i64 {old}, i64 {new} seq_cst seq_cst"
    return "\n".join([
        # spin(ctrl, ticks): the worker's side, for good: polls for a part, and after ``ticks``
        # without one sleeps on the word (a futex) until a caller claims it
        "define void @spin(ptr %ctrl, i64 %ticks) nounwind {",
        "entry:",
        "  %wake = " + cas.format(p="%ctrl", old=0, new=1),
        "  br label %outer",
        "outer:",
        "  %t0 = call i64 @llvm.readcyclecounter()",
        "  br label %poll",
        "poll:",
        "  %st = load atomic i64, ptr %ctrl acquire, align 8",
        "  %posted = icmp eq i64 %st, 2",
        "  br i1 %posted, label %take, label %awake",
        # 0 while polling: woken for a part the caller has taken back (or a spurious wake):
        # the word says spinning again (0 -> 1), so that later forks post without a wake.
        # Before, such a worker went back to sleep: at every fork of a run of small parts it
        # was asleep, each fork paid the wake (15-30 us on the VM) and it never took a part
        "awake:",
        "  %gone = icmp eq i64 %st, 0",
        "  br i1 %gone, label %respin, label %idle",
        "respin:",
        "  %rs = " + cas.format(p="%ctrl", old=0, new=1),
        "  br label %idle",
        "take:",
        "  %tk = " + cas.format(p="%ctrl", old=2, new=4),
        "  %took = extractvalue { i64, i1 } %tk, 1",
        "  br i1 %took, label %job, label %poll",
        "job:",
        "  %fp = getelementptr i64, ptr %ctrl, i64 1",
        "  %fn = load ptr, ptr %fp, align 8",
        "  %ap = getelementptr i64, ptr %ctrl, i64 2",
        "  %args = load ptr, ptr %ap, align 8",
        "  %sp = getelementptr i64, ptr %ctrl, i64 3",
        "  %seq = load i64, ptr %sp, align 8",
        "  call void %fn(ptr %args)",
        "  %dp = getelementptr i64, ptr %ctrl, i64 4",
        "  store atomic i64 %seq, ptr %dp release, align 8",
        "  store atomic i64 1, ptr %ctrl release, align 8",
        "  br label %outer",
        "idle:",
        "  call void @llvm.x86.sse2.pause()",
        "  %t = call i64 @llvm.readcyclecounter()",
        "  %dt = sub i64 %t, %t0",
        "  %more = icmp ult i64 %dt, %ticks",
        "  br i1 %more, label %polite, label %timeout",
        "polite:",  # past the first YIELD_TICKS: the core to any other runnable thread
        f"  %late = icmp ugt i64 %dt, {YIELD_TICKS}",
        "  br i1 %late, label %yield, label %poll",
        "yield:",
        "  " + _YIELD,
        "  br label %poll",
        "timeout:",  # fails while a caller holds the word (3): then poll on
        "  %sl = " + cas.format(p="%ctrl", old=1, new=0),
        "  %slept = extractvalue { i64, i1 } %sl, 1",
        "  %slv = extractvalue { i64, i1 } %sl, 0",
        "  %put = icmp eq i64 %slv, 0",  # a caller took back a part posted while asleep
        "  %leave = or i1 %slept, %put",
        "  br i1 %leave, label %sleep, label %outer",
        # asleep in the kernel while the word is 0; a caller's claim (0 -> 3) wakes it, and a
        # claim made before the wait makes the wait return at once (the futex compares)
        "sleep:",
        "  %zz = load atomic i64, ptr %ctrl acquire, align 8",
        "  %still = icmp eq i64 %zz, 0",
        "  br i1 %still, label %wait, label %outer",
        "wait:",
        "  " + _FUTEX.format(op=_FUTEX_WAIT, val=0),
        "  br label %outer",  # woken: polls (a word still 0 is made 1 there)
        "}",
        # fork(ctrls, nw, fn, argv): parts 1..nw to workers 0..nw-1 where spinning or asleep
        # (the caller wakes those first), part 0 here, then each part no worker has begun;
        # returns the mask of workers claimed asleep
        "define i64 @fork(ptr %ctrls, i64 %nw, ptr %fn, ptr %argv) nounwind {",
        "entry:",
        "  %seqs = alloca [64 x i64], align 8",
        "  %any = icmp sgt i64 %nw, 0",
        "  br i1 %any, label %post, label %self",
        "post:",
        "  %w = phi i64 [0, %entry], [%w.next, %post.next]",
        "  %held = phi i64 [0, %entry], [%held.n, %post.next]",
        "  %asleep = phi i64 [0, %entry], [%asleep.n, %post.next]",
        f"  %woff = mul i64 %w, {_WORDS}",
        "  %ctrl = getelementptr i64, ptr %ctrls, i64 %woff",
        "  %cl = " + cas.format(p="%ctrl", old=1, new=3),
        "  %claimed = extractvalue { i64, i1 } %cl, 1",
        "  %old = extractvalue { i64, i1 } %cl, 0",
        "  %bit = shl i64 1, %w",
        "  br i1 %claimed, label %write, label %try0",
        "try0:",  # asleep (being woken by the caller): posted all the same, maybe taken back
        "  %was0 = icmp eq i64 %old, 0",
        "  br i1 %was0, label %claim0, label %skip",
        "claim0:",
        "  %cl0 = " + cas.format(p="%ctrl", old=0, new=3),
        "  %claimed0 = extractvalue { i64, i1 } %cl0, 1",
        "  %asleep.w = or i64 %asleep, %bit",
        "  br i1 %claimed0, label %rouse, label %skip",
        "rouse:",  # woken before its part is written: it polls until the part is posted
        "  " + _FUTEX.format(op=_FUTEX_WAKE, val=1),
        "  br label %write",
        "write:",
        "  %asleep.p = phi i64 [%asleep, %post], [%asleep.w, %rouse]",
        "  %sp = getelementptr i64, ptr %ctrl, i64 3",
        "  %seq0 = load i64, ptr %sp, align 8",
        "  %seq = add i64 %seq0, 1",
        "  store i64 %seq, ptr %sp, align 8",
        "  %slot = getelementptr i64, ptr %seqs, i64 %w",
        "  store i64 %seq, ptr %slot, align 8",
        "  %fp = getelementptr i64, ptr %ctrl, i64 1",
        "  store ptr %fn, ptr %fp, align 8",
        "  %w1 = add i64 %w, 1",
        "  %argw = getelementptr ptr, ptr %argv, i64 %w1",
        "  %args = load ptr, ptr %argw, align 8",
        "  %ap = getelementptr i64, ptr %ctrl, i64 2",
        "  store ptr %args, ptr %ap, align 8",
        "  store atomic i64 2, ptr %ctrl release, align 8",
        "  %held.w = or i64 %held, %bit",
        "  br label %post.next",
        "skip:",
        "  br label %post.next",
        "post.next:",
        "  %held.n = phi i64 [%held.w, %write], [%held, %skip]",
        "  %asleep.n = phi i64 [%asleep.p, %write], [%asleep, %skip]",
        "  %w.next = add i64 %w, 1",
        "  %w.more = icmp slt i64 %w.next, %nw",
        "  br i1 %w.more, label %post, label %self",
        "self:",
        "  %heldf = phi i64 [0, %entry], [%held.n, %post.next]",
        "  %asleepf = phi i64 [0, %entry], [%asleep.n, %post.next]",
        "  %a0 = load ptr, ptr %argv, align 8",
        "  call void %fn(ptr %a0)",
        "  br i1 %any, label %join, label %done",
        "join:",
        "  %j = phi i64 [0, %self], [%j.next, %join.next]",
        "  %jbit = shl i64 1, %j",
        "  %jh = and i64 %heldf, %jbit",
        "  %mine = icmp ne i64 %jh, 0",
        "  %j1 = add i64 %j, 1",
        "  %argj = getelementptr ptr, ptr %argv, i64 %j1",
        "  %aj = load ptr, ptr %argj, align 8",
        "  br i1 %mine, label %reclaim, label %run",
        "reclaim:",  # a part its worker has not begun: taken back
        f"  %joff = mul i64 %j, {_WORDS}",
        "  %jc = getelementptr i64, ptr %ctrls, i64 %joff",
        "  %rc = " + cas.format(p="%jc", old=2, new=3),
        "  %back = extractvalue { i64, i1 } %rc, 1",
        "  br i1 %back, label %reclaimed, label %wait",
        # the posted part may be another caller's: ours finished, then that caller claimed
        # the word (1 -> 3 -> 2) before this check (ABA): its post stands, ours is done
        "reclaimed:",
        "  %rsp = getelementptr i64, ptr %jc, i64 3",
        "  %rseq = load i64, ptr %rsp, align 8",
        "  %rslot = getelementptr i64, ptr %seqs, i64 %j",
        "  %rwant = load i64, ptr %rslot, align 8",
        "  %rmine = icmp eq i64 %rseq, %rwant",
        "  br i1 %rmine, label %runback, label %notmine",
        "notmine:",
        "  store atomic i64 2, ptr %jc release, align 8",
        "  br label %wait",
        "runback:",  # the word as it was claimed: 0 where the worker was asleep
        "  call void %fn(ptr %aj)",
        "  %ja = and i64 %asleepf, %jbit",
        "  %jwas0 = icmp ne i64 %ja, 0",
        "  %jst = select i1 %jwas0, i64 0, i64 1",
        "  store atomic i64 %jst, ptr %jc release, align 8",
        "  br label %join.next",
        "wait:",
        "  %jslot = getelementptr i64, ptr %seqs, i64 %j",
        "  %want = load i64, ptr %jslot, align 8",
        "  %jdp = getelementptr i64, ptr %jc, i64 4",
        "  %w0 = call i64 @llvm.readcyclecounter()",
        "  br label %wait.poll",
        "wait.poll:",
        "  %fin = load atomic i64, ptr %jdp acquire, align 8",
        "  %ready = icmp sge i64 %fin, %want",
        "  br i1 %ready, label %join.next, label %wait.pause",
        "wait.pause:",  # a worker the OS took off its core: after YIELD_TICKS, yield to it
        "  call void @llvm.x86.sse2.pause()",
        "  %wt = call i64 @llvm.readcyclecounter()",
        "  %wdt = sub i64 %wt, %w0",
        f"  %wlate = icmp ugt i64 %wdt, {YIELD_TICKS}",
        "  br i1 %wlate, label %wait.yield, label %wait.poll",
        "wait.yield:",
        "  " + _YIELD,
        "  br label %wait.poll",
        "run:",  # no worker held: the part runs here
        "  call void %fn(ptr %aj)",
        "  br label %join.next",
        "join.next:",
        "  %j.next = add i64 %j, 1",
        "  %j.more = icmp slt i64 %j.next, %nw",
        "  br i1 %j.more, label %join, label %done",
        "done:",
        "  ret i64 %asleepf",
        "}",
        # grab(block): block = [fn, n, next, base, step]: every thread given the block takes
        # the next i (atomically) and runs fn(base + i * step) until none is left, so a
        # worker that starts late, or is slowed by other processes, takes fewer and the
        # caller waits at most for the one it is running
        "define void @grab(ptr %a) nounwind {",
        "entry:",
        "  %gfn = load ptr, ptr %a, align 8",
        "  %gnp = getelementptr i64, ptr %a, i64 1",
        "  %gn = load i64, ptr %gnp, align 8",
        "  %gcp = getelementptr i64, ptr %a, i64 2",
        "  %gbp = getelementptr i64, ptr %a, i64 3",
        "  %gbase = load i64, ptr %gbp, align 8",
        "  %gsp = getelementptr i64, ptr %a, i64 4",
        "  %gstep = load i64, ptr %gsp, align 8",
        "  br label %next",
        "next:",
        "  %gi = atomicrmw add ptr %gcp, i64 1 seq_cst",
        "  %gmore = icmp slt i64 %gi, %gn",
        "  br i1 %gmore, label %grun, label %gend",
        "grun:",
        "  %goff = mul i64 %gi, %gstep",
        "  %gaddr = add i64 %gbase, %goff",
        "  %gb = inttoptr i64 %gaddr to ptr",
        "  call void %gfn(ptr %gb)",
        "  br label %next",
        "gend:",
        "  ret void",
        "}",
        "declare i64 @llvm.readcyclecounter()",
        "declare void @llvm.x86.sse2.pause()"])


_SPIN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)
_FORK = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                         ctypes.c_void_p)
_JOB = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _module() -> jit.Module:
    return jit.compile_module("spin", module_ir, {"spin": _SPIN, "fork": _FORK, "grab": _JOB},
                              REQUIRES)


def unavailable() -> str | None:
    return jit.why_unavailable(REQUIRES) or jit.why_not_loaded("spin", _module)


class Pool:
    """The process's spinning workers (at most one fewer than the usable cores, 64 in all),
    started on first use and shared by every session: a worker another call holds is not
    used, so concurrent runs never wait for each other."""

    def __init__(self, size: int) -> None:
        self.size = size
        lines = aligned_zeros((max(1, size) + 2, _WORDS), np.int64, align=_WORDS * 8)
        self.ctrl = lines[1:-1]  # never reallocated
        self.base = self.ctrl.ctypes.data
        module = _module()
        self._spin, self._fork = module.spin, module.fork
        self.grab = function_address(module.grab)  # run_blocks' job
        self.grab_here = module.grab  # every row on the calling thread, one call
        self.started = [False] * size  # in order: 0 .. k-1
        self.lock = threading.Lock()

    def _start(self, n: int) -> None:
        with self.lock:
            for i in range(n):
                if not self.started[i]:
                    # spin never returns: the thread polls and sleeps in compiled code, the
                    # GIL released (ctypes), for the life of the process
                    threading.Thread(target=self._spin, daemon=True, name=f"onnxrun-spin-{i}",
                                     args=(self.base + i * _WORDS * 8, SPIN_TICKS)).start()
                    self.started[i] = True

    def fork(self, job: int, argv: np.ndarray, at: int = 0) -> int:
        """job(argv[i]) for every i, at once where workers are spinning: ``job`` a compiled
        function's address, ``argv`` (parts,) int64 addresses of argument blocks (kept alive
        by the caller until this returns), ``at`` its address where the caller holds it.
        Part 0 runs on this thread; a sleeping worker is woken by the fork itself. Returns
        the mask of the workers it found asleep (bit i: worker i)."""
        workers = len(argv) - 1
        if workers > self.size:
            raise ValueError(f"fork: {len(argv)} parts for {self.size} workers")
        if workers and not self.started[workers - 1]:
            self._start(workers)
        return self._fork(self.base, workers, job, at or jit.address(argv))


_pool: Pool | None = None
_pool_lock = threading.Lock()


def pool() -> Pool:
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = Pool(min(64, max(1, usable_cores() - 1)))
    return _pool


def function_address(fn) -> int:
    """A ctypes function's machine-code address (what ``fork`` calls)."""
    return ctypes.cast(fn, ctypes.c_void_p).value


def usable() -> Pool | None:
    """The pool, or None where the spinning workers cannot run here (then a kernel splits
    on parallel.py's queue). Once the pool exists (its module compiled), ~0.1 us a call."""
    if _pool is not None:
        return _pool
    return pool() if unavailable() is None else None


def run_blocks(job, blocks: np.ndarray, threads: int) -> None:
    """``job(block)`` for every row of ``blocks`` ((n, words) int64, C-contiguous: one argument
    block per call; ``job`` a ctypes function of one pointer), on up to ``threads`` threads:
    the caller and the spinning workers take rows in turn (@grab), each row whole on one
    thread. Without the pool (not x86, say) the rows go to parallel.py's queue."""
    n = len(blocks)
    if n == 0:
        return
    base, step = jit.address(blocks), blocks.strides[0]
    p = usable() if n > 1 else None
    if p is not None and threads <= 1:
        # every row on this thread, by @grab in one call: a Python loop of ctypes calls cost
        # ~1 us a row (a grouped convolution's 20 groups, each a few microseconds of work)
        grab = np.array((function_address(job), n, 0, base, step), np.int64)
        p.grab_here(jit.address(grab))
        return
    if p is None:
        if n == 1 or threads <= 1:
            for i in range(n):
                job(base + i * step)
        else:
            run_ranges(lambda i, _: job(base + i * step), [(i, i + 1) for i in range(n)])
        return
    parts = min(threads, p.size + 1, n)
    # per call (concurrent callers each have their own): grab's block, then the parts'
    # argument addresses, all pointing at it
    grab = np.empty(5 + parts, np.int64)
    at = jit.address(grab)
    grab[:5] = function_address(job), n, 0, base, step
    grab[5:] = at
    p.fork(p.grab, grab[5:], at=at + 40)


BUNDLE = {"spin": (module_ir, REQUIRES)}

__all__ = ["BUNDLE", "Pool", "SPIN_TICKS", "function_address", "pool", "run_blocks",
           "unavailable", "usable"]
