"""The device functions of modules compiled with backend="nvshmem" (`import tilec.device_nvshmem as td`): every
function of tilec/device.py (imported, not copied), plus the accesses that reach a peer by rank rather than by
pointer: tile gets and puts, flag waits on a peer's signal word and signal operations (codegen/nvshmem_printer.py
prints them for every access through a peer offset where ranks_per_node is smaller than the world).

The heap-base table of such a module has 2 * WORLD entries (runtime/launch.node_bases): entry p < WORLD is the base
a pointer to rank p's heap starts from (rank p's own mapping on this rank's node; this rank's own base off the
node, so a peer offset there is 0 and the address stays this rank's symmetric address, which NVSHMEM translates
itself); entry WORLD + p is rank p's heap as this process maps it, which only the CPU emulation has and reads: there
an off-node get or put copies through the shared-memory heap at that address, as NVSHMEM would over the network. A
pointer access to an off-node peer would read this rank's own copy, so the CPU tests see a wrong one.

On a GPU the off-node paths call NVSHMEM's device library (its puts, gets, quiet and put-with-signal declared
here with C's argument types): a kernel that calls them is compiled with the library linked
(runtime/nvshmem_heap.extern_libs). Flags are 64-bit signal words; a release to a peer off the node is a quiet
and a put-with-signal of no bytes (NVSHMEM_SIGNAL_ADD), and a wait polls the word (its own with acquire loads,
a peer's with NVSHMEM atomic fetches) against the GPU timer with tilec's timeout, never the unbounded signal_wait_until.
"""

import triton
import triton.language as tl
from triton.language import core

import tilec.device as _device
from tilec.device import backoff, clock, cta_any, keep_polling, release, timed_out, wait, wait_all

# every @triton.jit function of tilec/device.py, the same objects (the printed kernels call them as td.*): imported,
# not copied, so a helper added there is here too
# (a JITFunction, or the interpreter's InterpretedFunction: either wraps its Python function as .fn)
globals().update({n: f for n, f in vars(_device).items()
                  if getattr(getattr(f, "fn", None), "__module__", None) == _device.__name__})

# NVSHMEM's nvshmemx_signal_op_t (nvshmem_common_transport.h): SET = 9, ADD = 10. Not 5: that is NVSHMEMI_AMO_AND, which
# leaves a zero signal word at zero, so the peer's wait never saw it move
SIGNAL_ADD = tl.constexpr(10)


def with_wait_sleep(ns: int):
    """This module: its waits do not sleep (tilec.compile refuses wait_sleep_ns with backend nvshmem)."""
    import sys

    return sys.modules[__name__]


# -- NVSHMEM element puts and gets (thread scope: one element per lane), declared as torch declares its own ---------
def _extern(name: str, args, arg_types, ret, _semantic):
    return core.extern_elementwise("", "", args, {tuple(core.dtype(t) for t in arg_types): (name, core.dtype(ret))},
                                   is_pure=False, _semantic=_semantic)


@core.extern
def _p16(dest, value, pe, _semantic=None):
    return _extern("nvshmem_int16_p", [dest, value, pe], ("int64", "int16", "int32"), "int32", _semantic)


@core.extern
def _p32(dest, value, pe, _semantic=None):
    return _extern("nvshmem_int32_p", [dest, value, pe], ("int64", "int32", "int32"), "int32", _semantic)


@core.extern
def _p64(dest, value, pe, _semantic=None):
    return _extern("nvshmem_int64_p", [dest, value, pe], ("int64", "int64", "int32"), "int32", _semantic)


@core.extern
def _g16(source, pe, _semantic=None):
    return _extern("nvshmem_int16_g", [source, pe], ("int64", "int32"), "int16", _semantic)


@core.extern
def _g32(source, pe, _semantic=None):
    return _extern("nvshmem_int32_g", [source, pe], ("int64", "int32"), "int32", _semantic)


@core.extern
def _g64(source, pe, _semantic=None):
    return _extern("nvshmem_int64_g", [source, pe], ("int64", "int32"), "int64", _semantic)


@core.extern
def _fetch64(source, pe, _semantic=None):
    return _extern("nvshmem_int64_atomic_fetch", [source, pe], ("int64", "int32"), "int64", _semantic)


@core.extern
def _quiet(_semantic=None):
    return _extern("nvshmem_quiet", [], (), "int32", _semantic)


@core.extern
def _putmem_signal(dst, src, size_bytes, signal, sig_val, sig_op, pe, _semantic=None):
    return _extern("nvshmemx_putmem_signal_block", [dst, src, size_bytes, signal, sig_val, sig_op, pe],
                   ("int64", "int64", "int64", "int64", "uint64", "int32", "int32"), "int32", _semantic)


@triton.jit
def _putmem_signal_block(dst, src, size_bytes, signal, sig_val, sig_op, pe):
    # nvshmemx_putmem_signal_block with C's argument types. Declared here rather than taken from torch's
    # _nvshmem_triton, whose wrappers change their argument conventions between releases (int64 addresses, or
    # tensors whose addresses they take): the symbol is NVSHMEM's, linked from its device library either way.
    return _putmem_signal(dst.to(tl.int64), src.to(tl.int64), tl.cast(size_bytes, tl.int64),
                          signal.to(tl.int64), tl.cast(sig_val, tl.uint64), tl.cast(sig_op, tl.int32),
                          tl.cast(pe, tl.int32))


# -- where a peer is ----------------------------------------------------------------------------------------------
@triton.jit
def on_node(rank, peer, RPN: tl.constexpr):
    # ranks [n * RPN, (n + 1) * RPN) are node n (tilec/ir/nodes.py)
    return rank // RPN == peer // RPN


@triton.jit
def mapped(ptrs, rank, peer, heap_bases, WORLD: tl.constexpr):
    # CPU emulation of NVSHMEM's address translation: this rank's symmetric address in peer's heap as this process
    # maps it (entry WORLD + peer of the table)
    here = tl.load(heap_bases + rank)
    there = tl.load(heap_bases + WORLD + peer)
    return tl.cast(tl.cast(there, tl.pointer_type(tl.int8)) + (tl.cast(ptrs, tl.uint64) - here), ptrs.dtype)


@triton.jit
def _lanes(ptrs, mask, rank, peer, err):
    # masked-off lanes of an element put or get go to this rank's spare error word (an extern call cannot be masked)
    if mask is None:
        ok = tl.full(ptrs.shape, 1, tl.int1)
    else:
        ok = mask
    dest = tl.where(ok, tl.cast(ptrs, tl.int64), tl.cast(err + 6, tl.int64))
    pe = tl.where(ok, peer, rank).to(tl.int32)
    return ok, dest, pe


@triton.jit
def _nv_get(ptrs, mask, other, rank, peer, err):
    ok, src, pe = _lanes(ptrs, mask, rank, peer, err)
    SIZE: tl.constexpr = ptrs.dtype.element_ty.primitive_bitwidth
    if SIZE == 16:
        raw = _g16(src, pe)
    elif SIZE == 32:
        raw = _g32(src, pe)
    else:
        raw = _g64(src, pe)
    value = raw.to(ptrs.dtype.element_ty, bitcast=True)
    if other is not None:
        value = tl.where(ok, value, other)
    return value


@triton.jit
def _nv_put(ptrs, value, mask, rank, peer, err):
    ok, dest, pe = _lanes(ptrs, mask, rank, peer, err)
    SIZE: tl.constexpr = ptrs.dtype.element_ty.primitive_bitwidth
    v = value.to(ptrs.dtype.element_ty)
    if SIZE == 16:
        _p16(dest, v.to(tl.int16, bitcast=True), pe)
    elif SIZE == 32:
        _p32(dest, v.to(tl.int32, bitcast=True), pe)
    else:
        _p64(dest, v.to(tl.int64, bitcast=True), pe)


# -- tile gets and puts -------------------------------------------------------------------------------------------
@triton.jit
def get(ptrs, peer, rank, heap_bases, err, WORLD: tl.constexpr, RPN: tl.constexpr, INTERPRET: tl.constexpr,
        mask=None, other=None):
    # A tile of `peer`'s copy at ptrs (this rank's address plus the peer offset, which is 0 off the node): a load
    # through the pointer on this rank's node, else a get (NVSHMEM on a GPU, a copy through the heap on the CPU).
    if on_node(rank, peer, RPN):
        value = tl.load(ptrs, mask=mask, other=other)
    elif INTERPRET:
        value = tl.load(mapped(ptrs, rank, peer, heap_bases, WORLD), mask=mask, other=other)
    else:
        value = _nv_get(ptrs, mask, other, rank, peer, err)
    return value


@triton.jit
def put(ptrs, value, peer, rank, heap_bases, err, WORLD: tl.constexpr, RPN: tl.constexpr, INTERPRET: tl.constexpr,
        mask=None):
    # A tile stored into `peer`'s copy: through the pointer on this rank's node, else a put. The flag release that
    # follows (signal) orders it before the peer's read.
    if on_node(rank, peer, RPN):
        tl.store(ptrs, value, mask=mask)
    elif INTERPRET:
        tl.store(mapped(ptrs, rank, peer, heap_bases, WORLD), value, mask=mask)
    else:
        _nv_put(ptrs, value, mask, rank, peer, err)


@triton.jit
def remote_get(ptrs, rank, owner, heap_bases, err, WORLD: tl.constexpr, RPN: tl.constexpr,
               INTERPRET: tl.constexpr, mask=None, other=None):
    # A tile whose elements lie on different ranks (owner per element): each element by pointer where its owner
    # shares this rank's node, else by a get.
    near = on_node(rank, owner, RPN)
    here = tl.load(heap_bases + rank)
    there = tl.load(heap_bases + owner)  # this rank's own base off the node
    by_ptr = tl.cast(tl.cast(there, tl.pointer_type(tl.int8)) + (tl.cast(ptrs, tl.uint64) - here), ptrs.dtype)
    if mask is None:
        m_near = near
        m_far = near == 0
    else:
        m_near = mask & near
        m_far = mask & (near == 0)
    value = tl.load(by_ptr, mask=m_near, other=other)
    if INTERPRET:
        far = tl.load(mapped(ptrs, rank, owner, heap_bases, WORLD), mask=m_far, other=other)
    else:
        far = _nv_get(ptrs, m_far, other, rank, owner, err)
    return tl.where(near, value, far)


# -- flags: signal words ------------------------------------------------------------------------------------------
@triton.jit
def _peek(flag, rank, owner, heap_bases, WORLD: tl.constexpr, INTERPRET: tl.constexpr):
    # one poll of a peer's signal word off the node: an atomic fetch, not a get. NVSHMEM's get is a plain load where
    # the peer is reachable by pointer, which the compiler may hoist out of the polling loop once the library is
    # inlined (the wait then never saw the word move); an atomic is read again on every poll
    if INTERPRET:
        seen = tl.atomic_add(mapped(flag, rank, owner, heap_bases, WORLD), 0, sem="acquire", scope="sys")
    else:
        seen = _fetch64(tl.cast(flag, tl.int64), tl.cast(owner, tl.int32))
    return seen


@triton.jit
def wait_peer(flag, target, rank, owner, heap_bases, err, timeout_ns, flag_no, counter, SCOPE: tl.constexpr,
              INTERPRET: tl.constexpr, WORLD: tl.constexpr, RPN: tl.constexpr):
    # td.wait on `owner`'s signal word: through the pointer on this rank's node, else polled by gets, bounded by
    # the same wall-clock timeout (the first timeout recorded in err for the host's WaitTimeout)
    if on_node(rank, owner, RPN):
        wait(flag, target, rank, owner, heap_bases, err, timeout_ns, flag_no, counter, SCOPE, INTERPRET)
    else:
        # each thread polls the word itself: every decision is the program's (cta_any, tilec/device.py)
        seen = _peek(flag, rank, owner, heap_bases, WORLD, INTERPRET)
        if cta_any(seen < target, INTERPRET):
            start = clock(INTERPRET)
            while keep_polling(seen < target, start, timeout_ns, err, INTERPRET):
                backoff(INTERPRET)
                seen = _peek(flag, rank, owner, heap_bases, WORLD, INTERPRET)
            if cta_any(seen < target, INTERPRET):
                timed_out(err, flag_no, counter, owner, seen, target)
        tl.debug_barrier()


@triton.jit
def wait_all_peer(flags, idx, pending, target, rank, owner, heap_bases, err, timeout_ns, flag_no,
                  SCOPE: tl.constexpr, INTERPRET: tl.constexpr, WORLD: tl.constexpr, RPN: tl.constexpr):
    # td.wait_all on `owner`'s signal words: a block of them per poll, by gets off the node
    if on_node(rank, owner, RPN):
        wait_all(flags, idx, pending, target, rank, owner, heap_bases, err, timeout_ns, flag_no, SCOPE, INTERPRET)
    else:
        seen = _peek_all(flags + idx, pending, rank, owner, heap_bases, err, WORLD, INTERPRET)
        pending = pending & (seen < target)
        if cta_any(tl.max(pending.to(tl.int32), axis=0) > 0, INTERPRET):
            start = clock(INTERPRET)
            while keep_polling(tl.max(pending.to(tl.int32), axis=0) > 0, start, timeout_ns, err, INTERPRET):
                backoff(INTERPRET)
                now = _peek_all(flags + idx, pending, rank, owner, heap_bases, err, WORLD, INTERPRET)
                seen = tl.where(pending, now, seen)
                pending = pending & (seen < target)
            if cta_any(tl.max(pending.to(tl.int32), axis=0) > 0, INTERPRET):
                counter = tl.min(tl.where(pending, idx, 2147483647), axis=0)
                short = tl.min(tl.where(pending & (idx == counter), seen, 2147483647), axis=0)
                timed_out(err, flag_no, counter, owner, short, target)
        tl.debug_barrier()


@triton.jit
def _peek_all(ptrs, pending, rank, owner, heap_bases, err, WORLD: tl.constexpr, INTERPRET: tl.constexpr):
    # a block of polls of a peer's signal words off the node: atomic fetches, as in _peek
    if INTERPRET:
        seen = tl.atomic_add(mapped(ptrs, rank, owner, heap_bases, WORLD), 0, mask=pending, sem="acquire",
                             scope="sys")
    else:
        ok, src, pe = _lanes(ptrs, pending, rank, owner, err)
        seen = tl.where(ok, _fetch64(src, pe).to(ptrs.dtype.element_ty, bitcast=True), 0)
    return seen


@triton.jit
def signal(flag, rank, owner, heap_bases, SCOPE: tl.constexpr, INTERPRET: tl.constexpr, WORLD: tl.constexpr,
           RPN: tl.constexpr):
    # td.release of `owner`'s signal word: an atomic through the pointer on this rank's node, else (after every
    # thread's puts, fenced so they land first) NVSHMEM's put-with-signal of no bytes, adding 1 to the word
    if on_node(rank, owner, RPN):
        release(flag, rank, owner, heap_bases, SCOPE)
    elif INTERPRET:
        tl.debug_barrier()
        tl.atomic_add(mapped(flag, rank, owner, heap_bases, WORLD), 1, sem="release", scope="sys")
    else:
        _quiet()  # this thread's puts are complete (quiet, not fence: every thread's, once all have passed below)
        tl.debug_barrier()
        _putmem_signal_block(flag, flag, 0, flag, 1, SIGNAL_ADD, tl.cast(owner, tl.int32))
