"""Emitting tile reads and copies: pointer offsets of affine accesses, loads, peer offsets and fused pulls."""

from __future__ import annotations

from tilec.ir.dtypes import ESIZE
from tilec.ir.gather import Gathered
from tilec.ir.graph import InPlace, Pull, program_of, tensor
from tilec.ir.tiling import invert
from tilec.ir.types import ME, Access, Load, Var

from . import gathers
from . import kir as K
from .build import At, E, add, assign, bcast, call, cmp, conj, mul, plus, rank_div, sub, to, tup
from .text import row_major_strides


def tile_name(tensor_name: str, shape: tuple[int, ...]) -> str:
    """What a loaded value is called: `a_tile` for a tile of A, `lens_val` for one element of lens."""
    return f"{tensor_name.lower()}_{'tile' if any(n > 1 for n in shape) else 'val'}"


class Copies:
    """Mixin of _Emitter (emit.py): reads of tiles, local, remote or pulled through a fused copy, as kernel-IR nodes
    (build.py) placed among the task's statements."""

    def offsets(self, a: Access, masks: bool = True, at_zero: str | None = None,
                ranges: dict[str, str] | None = None, squeeze: bool = False) -> tuple[K.Expr, K.Expr | None]:
        """Pointer offset (broadcast over the tile's dims) and mask for an affine access (`at_zero`: that
        variable taken as 0; `ranges`: a tile variable's index vector under another name, e.g. one block;
        `squeeze`: broadcast over the tile dims only, so one-element dims leave no unit axes in the block)."""
        t = tensor(self.g, a.tensor)
        st = row_major_strides(t.shape)
        axes = [d for d, tv in enumerate(a.tile) if tv] if squeeze else list(range(len(a.index)))
        nd = len(axes)
        offs, mks = [], []
        wide = t.numel >= 2**31
        for d, (aff, tv) in enumerate(zip(a.index, a.tile, strict=True)):
            rest = [(v, k) for v, k in aff.terms if v != tv and v != at_zero]
            base = self.scalar(rest, aff.const)
            if tv:
                r = (ranges or {}).get(tv, f"{tv}_r")
                e = bcast(E(r) if base == K.Const(0) else add(base, r), axes.index(d), nd)
                m = self.mask_of(self.scope[tv], r)
                if m is not None and masks:
                    mks.append(bcast(m, axes.index(d), nd))
            else:
                e = base
            if wide and d == 0:
                e = to(e, "tl.int64")
            offs.append(e if st[d] == 1 else mul(e, st[d]))
        off = plus(*offs)
        if not any(a.tile):  # every dim is one element: keep the tile's (1, ..., 1) block shape
            off = plus(off, call("tl.zeros", tup(*(1 for _ in a.index)), dtype="tl.int32"))
        return off, conj(mks)

    def load(self, e: Load, out: list, indent: str) -> K.Expr:
        a = e.access
        if isinstance(a, Gathered):  # data-dependent rows
            return gathers.load(self, e, out, indent)
        for w in self.waits.pop(a, []):  # each tile read is waited for once per task
            self.wait(w, out, indent)
        off, mask = self.offsets(a)
        ptr = self.param(a.tensor)
        kw = {"mask": mask, "other": 0} if mask is not None else {}
        name = self.tmp(tile_name(a.tensor, e.shape))
        if a in self.ptrs:
            value = call("load", self.ptrs[a], **kw)
        elif a.remote:
            delta = self.peer_offset(E(a.rank), tensor(self.g, a.tensor).dtype, {a.rank}, out, indent)
            value = call("load", add(ptr, delta, off), **kw)
        else:
            value = call("load", add(ptr, off), **kw)
        out.append(At(indent, assign(name, value)))
        return E(name)

    def peer_offset(self, rank_expr: K.Expr, dtype: str, deps: set[str], out: list, indent: str) -> K.Expr:
        """Element offset to a peer's copy, computed once per task when the peer does not change inside loops (none
        in a world of one: the peer is this rank)."""
        if self.world == 1:
            return K.Const(0)
        key = (rank_expr, ESIZE[dtype])
        if not deps & self.loop_vars and key in self.peers:
            return self.peers[key]
        name = self.tmp(f"peer_{rank_expr.id}" if isinstance(rank_expr, K.Name) else "peer")
        node = assign(name, call("peer_offset", "heap_bases", "rank", rank_expr, ESIZE[dtype]))
        if deps & self.loop_vars:
            out.append(At(indent, node))
        else:
            self.prologue.append(At("    ", node))
            self.peers[key] = E(name)
        return E(name)

    def pull(self, e: Pull, body_out: list, body_indent: str, walk: str | None = None):
        """Read the copy's source directly: solve the copy's variables per element of the buffer tile (an InPlace
        read: only where the copy was local, the rest from the buffer). walk=v (in place only): emit, before the
        loop of reduction var v, the tile's pointers at v = 0 and return (pointers, mask) for the loop to load and
        advance (Compute.sum)."""
        prog = program_of(self.g)
        ploops = {v.name: v for v in e.producer} | {ME: Var(ME, "me", prog.world, 1, e.loc)}
        dims = invert(e.write, ploops, set(), prog.world, "fused-pull")
        nd = len(e.read.index)
        vals: dict[str, K.Expr] = {}
        if isinstance(e, InPlace):
            self.in_place_wait(e, dims)
            if e.write.rank != ME:  # a pushed copy: its destination is the rank holding the buffer read here
                vals[e.write.rank] = E("rank")
        scalar_ranks: dict[K.Expr, set[str]] = {}  # rank values that are one scalar per tile -> vars they depend on
        masks = []
        gaps = []  # masks of elements past the copy's extent (in place: only where the copy is local)
        for d, (inv, aff, tv) in enumerate(zip(dims, e.read.index, e.read.tile, strict=True)):
            span = e.read.shape[d]
            start = self.scalar(aff.terms, aff.const, {walk: "0"} if walk else None)
            cm = self.mask_of(self.scope[tv]) if tv else None
            if cm is not None:
                masks.append(bcast(cm, d, nd))
            uniform = all(x % span == 0 for x in (aff.const - inv.const, inv.extent)) and \
                (not inv.rank_var or inv.rank_coef % span == 0) and \
                all(k % span == 0 for v, k in aff.terms if v != tv)
            x = self.tmp("idx")
            # per-tile setup goes to the task prologue unless it moves with an enclosing reduction
            hoist = not (set(aff.vars) & self.loop_vars)
            out, indent = (self.prologue, "    ") if hoist else (body_out, body_indent)
            rk = f"{x}_rk"
            if uniform or not tv:
                out.append(At(indent, assign(x, sub(start, inv.const))))
                if inv.rank_var:
                    out += [At(indent, assign(rk, rank_div(x, inv.rank_coef, inv.world))),
                            At(indent, assign(x, sub(x, mul(inv.rank_coef, rk))))]
                    vals[inv.rank_var] = E(rk)
                    scalar_ranks[E(rk)] = set(aff.vars)
                if tv:
                    out.append(At(indent, assign(x, add(x, call("tl.arange", 0, span)))))
            else:
                out.append(At(indent, assign(x, sub(add(start, call("tl.arange", 0, span)), inv.const))))
                if inv.rank_var:
                    out += [At(indent, assign(rk, rank_div(x, inv.rank_coef, inv.world))),
                            At(indent, assign(x, sub(x, mul(inv.rank_coef, rk))))]
                    vals[inv.rank_var] = bcast(rk, d, nd)
            if inv.tile_var:
                vals[inv.tile_var] = bcast(x, d, nd) if tv else E(x)
                if inv.extent % span or not uniform:
                    gap = cmp(x, "<", inv.extent)
                    gaps.append(bcast(gap, d, nd) if tv else gap)
        out, indent = body_out, body_indent
        t = tensor(self.g, e.source.tensor)
        st = row_major_strides(t.shape)
        # the copy ran on the rank that holds the buffer read here: `rank` in the copy is that rank
        me_val = vals.get(ME, E("rank" if e.read.rank == ME else e.read.rank))
        offs = []
        for j, aff in enumerate(e.source.index):
            # a copy loop the buffer index does not solve has one trip (the verifier rejects the rest): it is 0
            terms = [(me_val if v == ME else vals.get(v, K.Const(0)), k) for v, k in aff.terms]
            ex = self.scalar(terms, aff.const)
            if t.numel >= 2**31 and j == 0:
                ex = to(ex, "tl.int64")
            offs.append(ex if st[j] == 1 else mul(ex, st[j]))
        ptr = self.param(e.source.tensor)
        if isinstance(e, InPlace):
            return self.in_place_load(e, vals, plus(ptr, *offs), masks, gaps, out, indent, walk)
        masks += gaps
        if walk:  # a local pull that solves no rank (Compute.local_pull): its pointers at walk = 0
            ptrs = self.tmp(f"{e.source.tensor.lower()}_ptrs")
            out.append(At(indent, assign(ptrs, plus(ptr, *offs))))
            return ptrs, conj(masks), None
        kw = {"mask": conj(masks), "other": 0} if masks else {}
        name = self.tmp(tile_name(e.source.tensor, e.shape))
        if e.source.rank == ME:
            src_rank = None if me_val == E("rank") else me_val
            if src_rank is not None and src_rank not in scalar_ranks:
                scalar_ranks[src_rank] = {e.read.rank}
        else:
            src_rank = vals.get(e.source.rank, E("rank"))
        if src_rank is None:
            value = call("load", plus(ptr, *offs), **kw)
        elif src_rank in scalar_ranks:
            delta = self.peer_offset(src_rank, t.dtype, scalar_ranks[src_rank], out, indent)
            value = call("load", plus(ptr, delta, *offs), **kw)
        else:  # the tile straddles ranks: iris translates each row's address to its own peer
            value = call("remote_load", plus(ptr, *offs), "rank", src_rank, "heap_bases", **kw)
        out.append(At(indent, assign(name, value)))
        return E(name)

    def in_place_load(self, e: InPlace, vals: dict[str, K.Expr], src_ptr: K.Expr, masks: list, gaps: list,
                      out: list, indent: str, walk: str | None = None):
        """Per element: the source in place where the copy was local (its source rank is this rank), else the
        buffer the peers' copies filled."""
        own = self.tmp("own")
        out.append(At(indent, assign(own, cmp(vals[e.source.rank], "==", "rank"),
                                     "this rank's own rows: read in place")))
        boff, bmask = self.offsets(e.read, at_zero=walk, ranges={walk: f"{walk}_r"} if walk else None)
        buf_ptr = add(self.param(e.read.tensor), boff)
        masks = [*masks, *(K.Bin("|", g, cmp(own, "==", 0)) for g in gaps)]
        if bmask is not None and not masks:
            masks = [bmask]
        mask = conj(masks)
        if walk:
            ptrs = self.tmp(f"{e.read.tensor.lower()}_ptrs")
            out.append(At(indent, assign(ptrs, call("tl.where", own, src_ptr, buf_ptr))))
            return ptrs, mask, own
        kw = {"mask": mask, "other": 0} if mask is not None else {}
        name = self.tmp(tile_name(e.read.tensor, e.shape))
        out.append(At(indent, assign(name, call("load", call("tl.where", own, src_ptr, buf_ptr), **kw))))
        return E(name)

    def in_place_wait(self, e: InPlace, dims) -> None:
        """The buffer's waits, only in tasks whose tile is a peer's rows (local-in-place keeps a read tile within
        one rank's rows; the local rows' counters are never released)."""
        ws = self.waits.pop(e.read, [])
        if not ws:
            return
        d = next(x for x in dims if x.rank_var == e.source.rank)
        aff = e.read.index[d.dim]
        first = len(self.wait_lines)
        for w in ws:
            self.wait(w, [], "    ")
        waits = tuple(x.stmt for x in self.wait_lines[first:])
        if not waits:
            return
        peer = E(self.tmp("peer_rows"))
        del self.wait_lines[first:]
        rows_rank = rank_div(sub(self.scalar(aff.terms, aff.const), d.const), d.rank_coef, d.world)
        why = "a peer's rows: wait until they have arrived"
        if len(waits) == 2 and isinstance(waits[0], K.Comment):  # one wait: what it waits for says it all
            why, waits = f"a peer's rows: {waits[0].text}", waits[1:]
        self.wait_lines += [At("    ", K.Assign(peer, cmp(rows_rank, "!=", "rank"))),
                            At("    ", K.If(peer, waits, (), why))]

    # -- flags -----------------------------------------------------------------------------------
