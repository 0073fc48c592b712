"""The fixed device functions of every emitted module (`import tilec.device as td`): flag waits and releases,
peer offsets, the timeline clock, the GEMM dot and the attend / lse_merge tile functions.

@triton.jit functions resolve the functions they call from their own module's globals, so an emitted kernel calls
these as `td.wait(...)` and Triton inlines them as if they were written there (also under TRITON_INTERPRET=1).
"""

import importlib.util
import sys
import time

import iris
import triton
import triton.language as tl


def cpu_yield():
    # CPU emulation only: ranks are processes sharing few cores; a spinning rank sleeps so its producer can run
    time.sleep(0.0002)


# Triton's cache key walks every name a kernel references, dead `if INTERPRET:` branches included, and rejects
# plain Python functions; this one only ever runs under the interpreter, so it is declared opaque to that walk.
cpu_yield.__triton_builtin__ = True


def cpu_now():
    # CPU emulation only: the interpreter has no %globaltimer
    return time.perf_counter_ns()


cpu_now.__triton_builtin__ = True  # see cpu_yield


@triton.jit
def clock(INTERPRET: tl.constexpr):
    # nanoseconds, one clock for every SM (%globaltimer), so records of different programs line up
    if INTERPRET:
        now = cpu_now()
    else:
        now = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False,
                                        pack=1)
    return now


@triton.jit
def timed_out(err, flag_no, counter, owner, seen, target):
    # the first wait of a call that timed out, for the host's WaitTimeout (CompiledProgram._check_timeout)
    if tl.atomic_cas(err, 0, 1) == 0:
        tl.store(err + 1, flag_no)
        tl.store(err + 2, counter)
        tl.store(err + 3, owner)
        tl.store(err + 4, seen)
        tl.store(err + 5, target)


# Nanoseconds a spinning wait sleeps between polls on a GPU: 0 (none) in this module; a program compiled with
# tilec.compile(wait_sleep_ns=N) imports the copy with_wait_sleep(N) makes, whose functions see N here.
WAIT_SLEEP_NS = tl.constexpr(globals().get("_WAIT_SLEEP_NS", 0))
_SLEEP_ASM = tl.constexpr(f"nanosleep.u32 {WAIT_SLEEP_NS.value}; mov.u32 $0, 0;")


def with_wait_sleep(ns: int):
    """This module again, as its own module `tilec.device_sleep<ns>`, whose spinning waits sleep `ns` nanoseconds
    between polls on a GPU: the module of a program compiled with wait_sleep_ns=ns imports it as `td`. (A
    @triton.jit function reads a constant from its own module's globals, so a program's value needs a module.)"""
    if not ns:
        return sys.modules["tilec.device"]
    name = f"tilec.device_sleep{int(ns)}"
    mod = sys.modules.get(name)
    if mod is None:
        spec = importlib.util.spec_from_file_location(name, __file__)
        mod = importlib.util.module_from_spec(spec)
        mod._WAIT_SLEEP_NS = int(ns)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return mod


@triton.jit
def backoff(INTERPRET: tl.constexpr):
    # between two polls of a spinning wait: the CPU emulation yields its core; a GPU program may sleep so that its
    # polls do not compete with the loads of programs still working (tilec.compile(wait_sleep_ns=))
    if INTERPRET:
        cpu_yield()
    elif WAIT_SLEEP_NS > 0:
        tl.inline_asm_elementwise(_SLEEP_ASM, "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def call_ok(err):
    # no wait of this call has timed out yet: once one has, the call fails and the others stop spinning too, so it
    # ends after one timeout, not one per waiting task (volatile: the loop re-reads it on every poll)
    return tl.load(err, volatile=True) == 0


# OR of a predicate over every thread of a program, and a barrier: `bar.red.or.pred` (PTX), on barrier 0 as Triton's
_ANY_ASM = tl.constexpr("{ .reg .pred p, q; setp.ne.s32 p, $1, 0; bar.red.or.pred q, 0, p; selp.s32 $0, 1, 0, q; }")


@triton.jit
def cta_any(x, INTERPRET: tl.constexpr):
    # whether x holds in any thread of this program, the same answer in all of them. A wait decides on values each
    # thread reads itself (the GPU timer, the error word, a peer's signal word by NVSHMEM): warps that disagreed
    # would leave its loop at different polls, and the program's later barriers (every scalar atomic, every
    # reduction across warps has one) would pair up wrongly and could hang it, which is what the timeout is for.
    # Every thread of the program reaches each call (waits are made at task level), so the barrier is met.
    if INTERPRET:  # one thread
        out = x
    else:
        out = tl.inline_asm_elementwise(_ANY_ASM, "=r,r", [x.to(tl.int32)], dtype=tl.int32, is_pure=False,
                                        pack=1) != 0
    return out


@triton.jit
def keep_polling(short, start, timeout_ns, err, INTERPRET: tl.constexpr):
    # one decision of the whole program after a poll: some thread still saw its counter short, and no thread has
    # seen the timeout pass or another wait of the call time out
    stop = (clock(INTERPRET) - start >= timeout_ns) | (call_ok(err) == 0)
    return cta_any(short, INTERPRET) & (cta_any(stop, INTERPRET) == 0)


@triton.jit
def wait(flag, target, rank, owner, heap_bases, err, timeout_ns, flag_no, counter, SCOPE: tl.constexpr,
         INTERPRET: tl.constexpr):
    # Acquire-spin on a counter (on `owner`'s heap) until it reaches target, for at most timeout_ns of wall-clock
    # time (%globaltimer on a GPU, the host's clock under the interpreter): then the first timeout is recorded in
    # err and the kernel moves on, so the host reports it instead of hanging. SCOPE: "gpu" for counters only this
    # GPU touches, "sys" where a peer GPU releases or reads them.
    # every decision below is the program's (cta_any, keep_polling), never one thread's: see cta_any
    seen = iris.atomic_add(flag, 0, rank, owner, heap_bases, sem="acquire", scope=SCOPE)
    if cta_any(seen < target, INTERPRET):  # only a wait that has to spin reads the clock
        start = clock(INTERPRET)
        while keep_polling(seen < target, start, timeout_ns, err, INTERPRET):
            backoff(INTERPRET)
            seen = iris.atomic_add(flag, 0, rank, owner, heap_bases, sem="acquire", scope=SCOPE)
        if cta_any(seen < target, INTERPRET):
            timed_out(err, flag_no, counter, owner, seen, target)


@triton.jit
def wait_all(flags, idx, pending, target, rank, owner, heap_bases, err, timeout_ns, flag_no, SCOPE: tl.constexpr,
             INTERPRET: tl.constexpr):
    # wait for a block of counters (flags + idx where pending): every poll is one round of atomics in parallel,
    # not one round trip per counter; a poll re-reads only the counters still short of target.
    seen = iris.atomic_add(flags + idx, 0, rank, owner, heap_bases, mask=pending, sem="acquire", scope=SCOPE)
    pending = pending & (seen < target)
    if cta_any(tl.max(pending.to(tl.int32), axis=0) > 0, INTERPRET):  # only a wait that has to spin reads the clock
        start = clock(INTERPRET)
        while keep_polling(tl.max(pending.to(tl.int32), axis=0) > 0, start, timeout_ns, err, INTERPRET):
            backoff(INTERPRET)
            now = iris.atomic_add(flags + idx, 0, rank, owner, heap_bases, mask=pending, sem="acquire", scope=SCOPE)
            seen = tl.where(pending, now, seen)
            pending = pending & (seen < target)
        if cta_any(tl.max(pending.to(tl.int32), axis=0) > 0, INTERPRET):  # report the first counter still short
            counter = tl.min(tl.where(pending, idx, 2147483647), axis=0)
            short = tl.min(tl.where(pending & (idx == counter), seen, 2147483647), axis=0)
            timed_out(err, flag_no, counter, owner, short, target)
    # each thread acquired its own counters: the barrier orders them before any thread's reads of the tiles
    tl.debug_barrier()


@triton.jit
def release(flag, rank, owner, heap_bases, SCOPE: tl.constexpr):
    # every thread's stores of the tile are done before the counter moves
    tl.debug_barrier()
    iris.atomic_add(flag, 1, rank, owner, heap_bases, sem="release", scope=SCOPE)


@triton.jit
def arrive(counter, target):
    # fold-last: bump this rank's arrival counter of a group of producer tasks (after the task's stores) and say
    # whether this bump completed the group (reached target = epoch * tasks per group). acq_rel: the completing
    # task sees every earlier arrival's stores (release sequence on one counter), so it may read them at once.
    tl.debug_barrier()  # every thread's stores of the tile are done before the counter moves
    done = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") + 1 == target
    tl.debug_barrier()  # the acquire is ordered before any thread's reads of the group's tiles
    return done


@triton.jit
def arrive_left(counter, target):
    # fold-last, shared: bump the group's counter like arrive and return how many of the group's tasks have yet to
    # arrive (0: this bump completed it). Distinct per arrival, so the last few can split the consumer's tasks.
    tl.debug_barrier()  # every thread's stores of the tile are done before the counter moves
    left = target - 1 - tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
    tl.debug_barrier()
    return left


@triton.jit
def mark(rec, stage, start, waited, INTERPRET: tl.constexpr):
    end = clock(INTERPRET)
    tl.store(rec, stage)
    tl.store(rec + 1, tl.program_id(0))
    tl.store(rec + 2, start)
    tl.store(rec + 3, waited)
    tl.store(rec + 4, end)


@triton.jit
def peer_offset(heap_bases, rank, peer, ESIZE: tl.constexpr):
    # Element offset from this rank's copy of a symmetric tensor to `peer`'s (same heap offset on every rank).
    # Added to local addresses once per tile, loads and stores keep the contiguity Triton needs to vectorize and
    # pipeline them (translating every address, as iris.load / iris.store do, cost ~3x in a GEMM and 10x in a
    # tile copy on the H200).
    delta = (tl.load(heap_bases + peer) - tl.load(heap_bases + rank)) // ESIZE
    return tl.multiple_of(delta, 16)


@triton.jit
def grow_rows(x):
    # [M, D] -> [2M, D], zero rows appended
    M: tl.constexpr = x.shape[0]
    D: tl.constexpr = x.shape[1]
    return tl.reshape(tl.permute(tl.join(x, tl.zeros_like(x)), (2, 0, 1)), (2 * M, D))


@triton.jit
def shrink_rows(x):
    # [2M, D] -> its first M rows
    M2: tl.constexpr = x.shape[0]
    D: tl.constexpr = x.shape[1]
    first, _rest = tl.split(tl.permute(tl.reshape(x, (2, M2 // 2, D)), (1, 2, 0)))
    return first


@triton.jit
def halve_rows(o, lse):
    # the first half of the rows of o [R, D] and lse [R]
    R: tl.constexpr = lse.shape[0]
    return shrink_rows(o), tl.reshape(shrink_rows(tl.reshape(lse, (R, 1))), (R // 2,))


@triton.jit
def attend_init(q):
    # Online-softmax state for q [M, D]: q padded with zero rows to the 16 tl.dot needs, running max, sum, acc.
    M: tl.constexpr = q.shape[0]
    if M <= 8:
        q = grow_rows(q)
    if M <= 4:
        q = grow_rows(q)
    if M <= 2:
        q = grow_rows(q)
    if M <= 1:
        q = grow_rows(q)
    MP: tl.constexpr = q.shape[0]
    D: tl.constexpr = q.shape[1]
    m = tl.full((MP,), float("-inf"), tl.float32)
    return q, m, tl.zeros((MP,), tl.float32), tl.zeros((MP, D), tl.float32)


@triton.jit
def attend_step(q, k, v, n, m, den, acc, SCALE: tl.constexpr, UPCAST: tl.constexpr, ZEROED: tl.constexpr):
    # One block of keys: k, v [S, D], of which the first n rows are valid (rows past n are masked to 0).
    # ZEROED: the caller's loads already gave 0 past n, so v goes to the dot as loaded (from shared memory; the
    # re-mask, which a cache slot holding NaN past n needs otherwise, cost 2-7% of the streaming rate on the H200).
    S: tl.constexpr = k.shape[0]
    valid = tl.arange(0, S) < n
    if not ZEROED:
        v = tl.where(valid[:, None], v, 0.0)
    if UPCAST:  # CPU interpreter (its bf16 dot is wrong)
        s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
    elif k.dtype == tl.float32:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    s = tl.where(valid[None, :], s * SCALE, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing valid yet: keep the state at zero
    alpha = tl.exp(m - m_safe)
    p = tl.exp(s - m_safe[:, None])
    den = den * alpha + tl.sum(p, axis=1)
    if UPCAST:
        acc = tl.dot(p, v.to(tl.float32), acc * alpha[:, None], input_precision="ieee")
    elif v.dtype == tl.float32:
        acc = tl.dot(p, v, acc * alpha[:, None], input_precision="ieee")
    else:
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return m_new, den, acc


@triton.jit
def attend_finish(m, den, acc, M: tl.constexpr):
    # o = acc / den and lse = m + log(den) for the first M rows; no valid key gives o = 0, lse = -inf.
    o = acc / tl.where(den == 0.0, 1.0, den)[:, None]
    lse = tl.where(den == 0.0, float("-inf"), m + tl.log(tl.where(den == 0.0, 1.0, den)))
    MP: tl.constexpr = o.shape[0]
    if MP // 2 >= M:
        o, lse = halve_rows(o, lse)
    if MP // 4 >= M:
        o, lse = halve_rows(o, lse)
    if MP // 8 >= M:
        o, lse = halve_rows(o, lse)
    if MP // 16 >= M:
        o, lse = halve_rows(o, lse)
    return o, lse


@triton.jit
def attend(q, k, v, n, SCALE: tl.constexpr, UPCAST: tl.constexpr):
    # One split of online-softmax attention: q [M, D] against the first n rows of k, v [S, D] (n may be <= 0:
    # an empty split gives o = 0, lse = -inf, which lse_merge then ignores). Returns o [M, D] and lse [M].
    # tl.dot when the tile allows it (S, D >= 16), else f32 broadcasting (tiny tiles).
    M: tl.constexpr = q.shape[0]
    S: tl.constexpr = k.shape[0]
    D: tl.constexpr = k.shape[1]
    if S >= 16 and D >= 16:
        qp, m, den, acc = attend_init(q)
        m, den, acc = attend_step(qp, k, v, n, m, den, acc, SCALE, UPCAST, False)
        o, lse = attend_finish(m, den, acc, M)
    else:
        valid = tl.arange(0, S) < n
        qf = q.to(tl.float32)
        kf = k.to(tl.float32)
        vf = tl.where(valid[:, None], v.to(tl.float32), 0.0)
        s = tl.sum(qf[:, None, :] * kf[None, :, :], axis=2) * SCALE
        s = tl.where(valid[None, :], s, float("-inf"))
        mx = tl.max(s, axis=1)
        mx = tl.where(mx == float("-inf"), 0.0, mx)
        p = tl.exp(s - mx[:, None])
        den = tl.sum(p, axis=1)
        o = tl.sum(p[:, :, None] * vf[None, :, :], axis=1) / tl.where(den == 0.0, 1.0, den)[:, None]
        lse = tl.where(den == 0.0, float("-inf"), mx + tl.log(tl.where(den == 0.0, 1.0, den)))
    return o, lse


@triton.jit
def lse_merge(o, lse, N):
    # Merge N partial softmax results: o [NP, M, D], lse [NP, M] (rows >= N are padding) ->
    # O = sum_i exp(lse_i - L) o_i with L = logsumexp_i lse_i, and L itself; all-empty gives 0 and -inf.
    NP: tl.constexpr = lse.shape[0]
    lse = tl.where((tl.arange(0, NP) < N)[:, None], lse.to(tl.float32), float("-inf"))
    big = tl.max(lse, axis=0)
    big = tl.where(big == float("-inf"), 0.0, big)
    w = tl.exp(lse - big[None, :])
    den = tl.sum(w, axis=0)
    out = tl.sum(w[:, :, None] * o.to(tl.float32), axis=0) / tl.where(den == 0.0, 1.0, den)[:, None]
    return out, tl.where(den == 0.0, float("-inf"), big + tl.log(tl.where(den == 0.0, 1.0, den)))


@triton.jit
def dot(a, b, acc, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    # UPCAST: the CPU interpreter's bf16 dot is wrong, so it multiplies in f32 there
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    if IEEE:
        out = tl.dot(a, b, acc, input_precision="ieee", out_dtype=tl.float32)
    else:
        out = tl.dot(a, b, acc, out_dtype=tl.float32)
    return out


@triton.jit
def enter(epoch, EPOCH_AT, GRAPH: tl.constexpr, PDL: tl.constexpr):
    # the first thing every kernel does; returns the call's epoch
    if PDL:  # launched as a programmatic dependent of the stream's previous kernel (LaunchContext.pdl)
        # every program of this launch is resident once all have passed here: the next kernel may take the SMs
        # this one leaves idle (it waits below for this one to finish)
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()  # the previous kernel has finished and its writes are visible
    if GRAPH == 2:  # the epoch is on the device and this kernel advances it itself (leave): EPOCH_AT holds the last
        epoch = tl.load(EPOCH_AT) + 1
    elif GRAPH:  # a call replayed from a CUDA graph (Program.capture): the graph bumps the epoch before the kernels
        epoch = tl.load(EPOCH_AT)
    return epoch


@triton.jit
def first_task(pid, claim, CLAIM: tl.constexpr):
    # a persistent loop's first task: its program's own (task pid + j * NPROG), or with CLAIM the next one no
    # program has taken yet. Claimed in task order by the programs that run, a program that is not resident (ranks
    # side by side under MPS do not all get every SM they were sized for) holds no task back: the others take its
    # share, and no wait can be on a task that only a program still off the GPU would run.
    if CLAIM:
        task = tl.atomic_add(claim, 1, sem="relaxed")
    else:
        task = pid
    return task


@triton.jit
def program_major(task, n: tl.constexpr, NPROG: tl.constexpr, CLAIM: tl.constexpr):
    # task's place in an order of the first n tasks where each program's (every NPROG-th) are one stretch of them,
    # so a program runs its share of a mix of tasks in the mix's order; the last n % NPROG and those from n on stay.
    # Claimed tasks (CLAIM) keep task order: the programs running at once then take adjoining tiles (order.py)
    if not CLAIM and task < NPROG * (n // NPROG):
        task = task % NPROG * (n // NPROG) + task // NPROG
    return task


@triton.jit
def next_task(task, claim, NPROG: tl.constexpr, CLAIM: tl.constexpr):
    if CLAIM:
        task = tl.atomic_add(claim, 1, sem="relaxed")
    else:
        task += NPROG
    return task


@triton.jit
def claims_done(claim, NPROG: tl.constexpr, CLAIM: tl.constexpr):
    # CLAIM: claim[1] counts the programs past their last claim; the last of them resets both for the next call
    # (which starts after this kernel ends: stream order, or gdc_wait under PDL)
    if CLAIM:
        if tl.atomic_add(claim + 1, 1, sem="acq_rel") == NPROG - 1:
            tl.store(claim, 0)
            tl.store(claim + 1, 0)


@triton.jit
def leave(EPOCH_AT, epoch, NPROG: tl.constexpr, GRAPH: tl.constexpr):
    # the last thing every kernel does. GRAPH == 2 (a call that is one kernel, its epoch on the device): the last of
    # its NPROG programs to get here publishes the call's epoch for the next call, which reads it after this kernel
    # ends (stream order, or gdc_wait under PDL). A separate bump before the kernel cost 1-2 us per graph replay on
    # an H200 (benchmarks/runs/epoch_probe.py). EPOCH_AT[1] counts the programs that finished, back to 0 each call.
    if GRAPH == 2:
        if tl.atomic_add(EPOCH_AT + 1, 1, sem="acq_rel") == NPROG - 1:
            tl.store(EPOCH_AT + 1, 0)
            tl.store(EPOCH_AT, epoch)


@triton.jit
def barrier(bar, err, heap_bases, rank, timeout_ns, WORLD: tl.constexpr, INTERPRET: tl.constexpr):
    # A barrier of every rank as a one-program kernel (launch.device_barrier): what a call uses instead of the host
    # barrier where the host cannot wait (inside a CUDA graph capture). bar[0] counts arrivals from every rank and
    # bar[1] the barriers this rank has entered (only it touches that one): barrier n is passed once bar[0] reaches
    # n * WORLD. Stream order has this rank's earlier work finished before it arrives; release / acquire at system
    # scope make that work visible to the peers that pass. A wait that times out is reported like a flag wait's,
    # as flag 0 (CompiledProgram._check_timeout).
    n = tl.atomic_add(bar + 1, 1, sem="relaxed") + 1
    for peer in tl.static_range(WORLD):
        iris.atomic_add(bar, 1, rank, peer, heap_bases, sem="release", scope="sys")
    wait(bar, n * WORLD, rank, rank, heap_bases, err, timeout_ns, 0, n, "sys", INTERPRET)


@triton.jit
def rows_ok(rows, pos, live, n, err, number):
    # data-dependent rows (tilec/codegen/gathers.py): the live lanes of index tile `rows` (read at elements `pos` of
    # its tensor) that are rows 0..n-1; the first call's first offence (check `number`, its element and value) goes
    # to the error word for the host's IndexRangeError, and the lanes out of range are masked, never read
    bad = live & ((rows < 0) | (rows >= n))
    if tl.sum(bad.to(tl.int32), axis=0) > 0:
        p = tl.max(tl.where(bad, pos, -1), axis=0)
        v = tl.sum(tl.where(bad & (pos == p), rows, 0), axis=0)
        if tl.atomic_cas(err, 0, 2) == 0:
            tl.store(err + 1, number)
            tl.store(err + 2, p)
            tl.store(err + 3, v)
    return live & (bad == 0)


@triton.jit
def count_ok(count, pos, extent, err, number):
    # a loop's count of valid rows (element `pos` of its tensor) clamped to 0..extent; out of it, recorded as rows_ok
    if (count < 0) | (count > extent):
        if tl.atomic_cas(err, 0, 2) == 0:
            tl.store(err + 1, number)
            tl.store(err + 2, pos)
            tl.store(err + 3, count)
    return tl.minimum(tl.maximum(count, 0), extent)


@triton.jit
def rows_unique(claimed, rows, pos, live, epoch, err, number):
    # a scatter's rows (tilec/codegen/gathers.py): the live lanes whose claim word did not already hold this call's
    # epoch (written by no other lane or task of the call); the first duplicate is recorded as rows_ok records
    dup = live & (claimed == epoch)
    if tl.sum(dup.to(tl.int32), axis=0) > 0:
        p = tl.max(tl.where(dup, pos, -1), axis=0)
        v = tl.sum(tl.where(dup & (pos == p), rows, 0), axis=0)
        if tl.atomic_cas(err, 0, 2) == 0:
            tl.store(err + 1, number)
            tl.store(err + 2, p)
            tl.store(err + 3, v)
    return live & (dup == 0)
