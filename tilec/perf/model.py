"""A cost model of one call of a compiled program, per rank: where the time goes and what each tax costs.

    predicted = max(compute, comm) + BSP tax + SM copy time + copy-engine time left over
                + locality tax + launch tax + flag waits

compute       Dot FLOPs / GEMM rate, or the stage's own HBM traffic / HBM bandwidth where that is larger (distinct
              bytes of its operands: re-reads of a tile come from L2, which is how a tiled GEMM reaches cuBLAS
              speed). A kernel launched beside others gets its share of the SMs, so its FLOPs run at that share;
              tasks run in waves of one per program, and the last wave's idle programs are charged.
comm          remote bytes (peer loads, pulls, pushes) / link bandwidth + one link latency per kernel that talks to
              peers. Every remote read crosses the link: a peer's memory is cached in the peer's L2, not the
              reader's, so a remote tile re-read once per output column (fused-pull) is fetched once per read.
BSP tax       barriers x barrier_us (+ barrier_skew_us once per stretch of work a barrier ends and
              barrier_skew_share of the call's work: ranks side by side under MPS do not end their kernels
              together), plus serialization: kernels run one after another (bsp) overlap nothing, so sum over
              kernels of max(compute, comm) exceeds max(total compute, total comm) by the idle time. Kernels of one
              launch phase (flags: concurrent kernels) or one fused kernel overlap compute with link traffic (a
              fused kernel's SM copies excepted: SM copy time); the stages of a specialized kernel run side by side,
              each on its group of programs.
locality tax  buffers that round-trip through HBM: bytes written + distinct bytes read back, at HBM bandwidth.
              A buffer written and read inside one kernel costs the same once it exceeds L2. Bytes the copy
              engines write are their copy time (which overlaps), so only their read-back is charged here.
launch tax    launches x launch_us.
SM copy time  the SMs a copy takes from compute: in one persistent kernel whose programs run its stages' tasks in
              turn (fused-push: every gather task, then every GEMM task), a stage's tasks hold their programs for
              max(its compute, its link time), and the stages add; the link time of a copy stage is therefore not
              hidden under the GEMM of the same kernel. (Concurrent kernels already pay by their SM share; the
              stages of a specialized kernel overlap on their own programs.)
copy-engine   stages with transport=dma run in no kernel and on no SM: their chunks (codegen/dma.py) go out on side
time          streams, one per peer ring distance as runtime/dma.py issues them; a stream's time is the sum over its
              chunks of bytes / (ce_link_GBps if a peer's memory is read or written, else ce_GBps) + ce_latency_us
              per issued copy (the chunk's flag write is one), and the peers' streams share the link. They overlap
              the kernels: the call cannot end before the last chunk lands and its consumer has worked on it, so
              the kernels' time T becomes max(T, CE + consumer compute / chunks); only what exceeds T is added.
flag waits    not one of the three taxes but the price of removing them: each wait is a serial acquire poll round in
              its program, of one counter or of a block polled at once (flag_us; a peer's counter:
              link_latency_us), spread over the kernel's programs.
dot beside    (dot_beside_copies, 1 but under MPS) a Dot stage whose kernel runs SM copy tasks in turn with its
copies        tasks on the same programs (fused-push's interleaved gather) takes that much longer, plus
              dot_beside_copies_per_k2 per doubling of K beyond 4096 (mps_rank).
Deliberately simple: ranks are balanced, taxes add (they are not hidden under compute), and no pipeline fill is
charged. `tilec.perf.auto.rank_schedules` ranks schedules, each with its copy stages on the SMs and (where the
transport pass accepts it) on the copy engines, with it.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, fields, replace

from tilec.errors import TilecError


@dataclass(frozen=True)
class Machine:
    """Rates of one GPU and its links. Defaults: one H200 (docs/GPU.md); barrier_us and flag_us are fitted to the
    world-1 H200 bench of eager calls (tests/data/h200_ag_gemm_eager_events.json): bsp minus fused-pull
    leaves ~100 us per host barrier beyond the copies, and the flags schedule's 663k satisfied waits on 66 programs cost
    ~2 ms (~0.2 us each)."""

    name: str = "H200 (docs/GPU.md defaults)"
    gemm_tflops: float = 750.0  # bf16/f16 dense GEMM (cuBLAS 8192^3: 745)
    f32_tflops: float = 50.0  # f32 tl.dot in ieee precision (CUDA cores, 67 peak)
    hbm_GBps: float = 4200.0  # device copy, read + write counted
    link_GBps: float = 450.0  # NVLink 4, per GPU, each direction
    link_latency_us: float = 2.0  # a remote round trip
    launch_us: float = 11.0  # a Triton launch from Python, back to back
    barrier_us: float = 100.0  # a host barrier: device sync, gloo barrier, relaunch
    flag_us: float = 0.25  # one acquire poll of a local counter that is already set
    # copy engines (transport=dma), measured by `tilec calibrate` on one H200 (ce_link_GBps needs two GPUs: an
    # estimate until then); a machine file written before these fields existed loads with these defaults
    ce_GBps: float = 2080.0  # a device-to-device cudaMemcpyAsync on a side stream, bytes copied per second
    ce_link_GBps: float = 370.0  # a peer copy by a copy engine over NVLink 4 (~80% of link_GBps, as NCCL's CE path)
    ce_latency_us: float = 5.6  # per issued copy: the driver's cudaMemcpyAsync call + the engine's start
    sms: int = 132
    l2_MB: float = 50.0
    link: str = "nvlink"  # what a peer's memory is reached through: "hbm" for ranks side by side on one GPU (MPS)
    # how much longer a Dot stage's tasks take when SM copy tasks run in turn with them on the same programs of one
    # persistent kernel (fused-push's interleaved gather); 1: no slower (mps_rank sets what MPS measured)
    dot_beside_copies: float = 1.0
    dot_beside_copies_per_k2: float = 0.0  # added to it per doubling of the program's K beyond 4096 (the K loop)
    # what a host barrier waits for beyond barrier_us when the ranks' work before it does not end together (ranks side
    # by side under MPS); paid once per stretch of work a barrier ends (a call's entry and exit barriers pay it once)
    barrier_skew_us: float = 0.0
    barrier_skew_share: float = 0.0  # and that share of the call's work (the ranks' drift), once per call
    start_skew_us: float = 0.0  # a call whose kernels wait on flags waits this long for the latest rank to start
    # between nodes (backend nvshmem, ranks_per_node < world): one 400 Gb/s InfiniBand NDR NIC per GPU, as DGX/HGX
    # H200 nodes have, is 50 GB/s each way; NVSHMEM's IBGDA puts reach ~90-95% of it on large messages, so 45 GB/s.
    # A small put's one-way latency over one switch is ~2-3 us (NIC doorbell, wire, remote PCIe write); a poll of a
    # peer's signal word by get is a round trip, ~3 us. Estimates from the NIC's rate, not measured here.
    inter_node_GBps: float = 45.0
    inter_node_latency_us: float = 3.0

    def save(self, path: str | os.PathLike) -> None:
        from tilec.fileio import write_atomic

        write_atomic(path, json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, path: str | os.PathLike) -> Machine:
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            raise TilecError(f"machine file {path}: {e}") from None
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise TilecError(f"machine file {path}: unknown field(s) {', '.join(unknown)}; fields: "
                             f"{', '.join(sorted(known))}")
        return cls(**data)


H200 = Machine()


# Ranks side by side on one H200 under MPS (benchmarks/results/h200-1gpu-mps/fused_vs_bsp, 8192x4608x36864 f16):
# - a rank's GEMM rate over its SM share of the GPU's: the concurrent torch.matmul rows ran 375 TFLOP/s per rank at
#   world 2 on 66 SMs (ag_gemm_w2.json matmul 7423 us, gemm_rs_w2.json 3690 us: 1.0x the share) and 200 at world 4 on
#   32 (ag_gemm_w4.json 13851 us, gemm_rs_w4.json 3501 us: 1.1x the share); between the two worlds interpolated.
MPS_GEMM_SHARE_RATE = {2: 1.0, 4: 1.1}
# - a host barrier: beside each other the ranks' kernels do not end together (a rank does not always get every SM its
#   share reports), so a host barrier waits for the slowest one, and MPS's barrier itself costs more with more clients.
#   Measured bsp (one host barrier between its kernels) minus the model's bsp without it, over the ten shapes' rows
#   (fused_vs_bsp/{ag_gemm,gemm_rs}_w{2,4}.json, paper_shapes/*.json): 210-914 us at world 2 (300 and 383 at
#   1024x3584x8192, ag_gemm_w2_1024_3584_8192.json, gemm_rs_w2_1024_3584_8192.json, whose work is 0.1-0.2 ms), at
#   world 4 750 and 808 us there (ag_gemm_w4_1024_3584_8192.json, gemm_rs_w4_1024_3584_8192.json) and up to 2742 and
#   3263 us at 8192x28672x8192 (ag_gemm_w4_8192_28672_8192.json, gemm_rs_w4_8192_28672_8192.json): a fixed part and
#   a part growing with the work, both per rank beyond the first. 230 us + 5% of the call's work per extra rank puts
#   every such row within 20% but gemm_rs_w4_owners_in_rank_order.json's bsp (7494 us, the same code as
#   gemm_rs_w4.json's 5868: the spread of two runs).
MPS_BARRIER_SKEW_US = 230.0
MPS_BARRIER_SKEW_SHARE = 0.05
# - fused-push's GEMM tasks beside its interleaved copy tasks run longer: 517 us each against bsp's 389
#   (ag_gemm_w2.json timelines, rank 0); specialized's GEMM beside copies on programs of their own ran 374 us per task
#   (ag_gemm_w2_schedules/taxes_timeline_static.log), so only copies in turn on the same programs pay. How much longer
#   grows with K (each task's K loop: longer panels through L2 beside the copies' stores) and the world: the factor
#   that makes the model meet fused-push's measured time is 1.03, 1.12, 1.10, 1.34 at world 2 for K = 4096, 8192,
#   14336, 36864 (paper_shapes/ag_gemm_w2_8192_11008_4096.json, _8192_28672_8192.json, _8192_3584_14336.json,
#   fused_vs_bsp/ag_gemm_w2.json) and 1.13, 1.20, 1.21, 1.36 at world 4 (the same at w4): 1 + 0.03 per rank beyond the
#   first + 0.08 per doubling of K beyond 4096.
MPS_DOT_BESIDE_COPIES = 0.03  # per rank beyond the first
MPS_DOT_BESIDE_COPIES_PER_K2 = 0.08


# - a fused kernel that waits on its peers' flags waits for the latest rank to start (the ranks leave the harness's
#   barrier apart, as a host barrier's): none measurable at world 2 (gemm_rs_w2_1024_3584_8192.json fused-push 107 us,
#   the model's 107), ~100 us at world 4 (gemm_rs_w4_1024_3584_8192.json fused-push 199 us against the model's 99;
#   ag_gemm_w4_1024_3584_8192.json's 444 against 426 bounds it): 80 us at world 4, interpolated from 0 at world 2.
MPS_START_SKEW_US = {2: 0.0, 4: 80.0}
# - the copy engines (transport=dma): at world 2 the model's copy-engine time stays under the GEMM and the rows match
#   (paper_shapes/ag_gemm_w2_8192_11008_4096.json auto: fused-push+dma 2063 us, model 2016; _8192_3584_14336 2307 vs
#   2384; _8192_28672_8192 10086 vs 10356); at world 4 the same schedule ran 8710 us (ag_gemm_w4_8192_11008_4096.json,
#   per rank 7285-8710) against the model's 3769, its fused-push on the SMs 4330: the four clients' copies did not
#   overlap the GEMM as the model's 5.6 us per issued copy says. 250 us per issued copy at world 4 meets that row
#   (8168 us; one row: the mechanism is not measured here), interpolated from the H200's 5.6 at world 2.
MPS_CE_LATENCY_US = {4: 250.0}


def _by_world(table: dict[int, float], world: int, low: float) -> float:
    """A per-world MPS constant: `low` up to world 2, the table's value from its world on, linear between."""
    (w1, v1), = table.items()
    return low + (v1 - low) * min(1.0, max(0.0, (world - 2) / (w1 - 2)))


def _mps_gemm_rate(world: int) -> float:
    """MPS_GEMM_SHARE_RATE at `world`: linear between the two measured worlds, flat beyond them."""
    (w0, r0), (w1, r1) = sorted(MPS_GEMM_SHARE_RATE.items())
    return r0 + (r1 - r0) * min(1.0, max(0.0, (world - w0) / (w1 - w0)))


def across_nodes(m: Machine, world: int, ranks_per_node: int) -> Machine:
    """m as seen by one rank of `world` on nodes of `ranks_per_node`: a peer's bytes go over NVLink on the node and
    over the inter-node link off it. The model's remote traffic is spread over the peers (an all-gather, a
    reduce-scatter, a decode's exchange send and receive the same bytes to and from every peer), so a share
    (world - ranks_per_node) / (world - 1) of it leaves the node; both links move at once, so the slower side sets
    the effective rate, and a remote round trip (a kernel's first remote access, a remote flag poll) is the
    inter-node latency. Barriers and launches are unchanged (a host barrier of 64 ranks over gloo costs more:
    not modelled)."""
    if ranks_per_node >= world:
        return m
    off = (world - ranks_per_node) / (world - 1)
    per_byte = max((1 - off) / m.link_GBps, off / m.inter_node_GBps)  # seconds per GB: both links at once
    return replace(m, name=f"{m.name}: {world} ranks on nodes of {ranks_per_node}", link_GBps=1.0 / per_byte,
                   link_latency_us=max(m.link_latency_us, m.inter_node_latency_us), ce_link_GBps=1.0 / per_byte,
                   link="nvlink+ib")


def mps_rank(m: Machine, world: int, sms: int) -> Machine:
    """What one of `world` ranks side by side on one GPU under MPS has (benchmarks/runs/mps_world.sh): its `sms` of the
    GPU's SMs, so that share of the GEMM (times what the concurrent matmul measured: MPS_GEMM_SHARE_RATE) and f32
    rates; the GPU's HBM, shared by the ranks; a link to a peer that is the same HBM (a peer's heap is memory of
    this GPU); host barriers that wait for the slowest of the ranks (MPS_BARRIER_SKEW_US and
    MPS_BARRIER_SKEW_SHARE of the work per rank beyond the first); and GEMM tasks slower in turn with copy tasks
    (MPS_DOT_BESIDE_COPIES*). At world 2 on one H200 a rank computes at 375 TFLOP/s: two torch.matmul of
    8192x4608x36864 side by side ran 7.4 ms each (benchmarks/results/h200-1gpu-mps/fused_vs_bsp/ag_gemm_w2.json)."""
    f = sms / m.sms
    hbm = m.hbm_GBps / world
    return replace(m, name=f"{m.name}: one of {world} ranks on one GPU under MPS ({sms} SMs, links through HBM)",
                   gemm_tflops=m.gemm_tflops * f * _mps_gemm_rate(world), f32_tflops=m.f32_tflops * f,
                   hbm_GBps=hbm, link_GBps=hbm, link_latency_us=1.0, ce_link_GBps=min(m.ce_GBps, hbm), sms=sms,
                   link="hbm", barrier_skew_us=MPS_BARRIER_SKEW_US * max(0, world - 1),
                   barrier_skew_share=MPS_BARRIER_SKEW_SHARE * max(0, world - 1),
                   dot_beside_copies=1.0 + MPS_DOT_BESIDE_COPIES * max(0, world - 1),
                   dot_beside_copies_per_k2=MPS_DOT_BESIDE_COPIES_PER_K2,
                   start_skew_us=_by_world({4: MPS_START_SKEW_US[4]}, world, MPS_START_SKEW_US[2]),
                   ce_latency_us=_by_world(MPS_CE_LATENCY_US, world, m.ce_latency_us))


@dataclass(frozen=True)
class Prediction:
    """Predicted microseconds of one call on one rank; *_share = tax / predicted."""

    compute_us: float
    comm_us: float
    overlap_us: float  # max(compute, comm): the work if nothing serialized it
    serialization_us: float  # idle time because kernels run one after another (part of the BSP tax)
    barrier_us: float  # barriers x barrier_us + the skew they wait out (barrier_skew_us; the other part)
    bsp_tax_us: float
    locality_tax_us: float
    launch_tax_us: float
    flag_wait_us: float
    sm_copy_us: float  # link time of SM copies that no other stage of their kernel hides (see the module doc)
    copy_engine_us: float  # the copy engines' time (slowest stream or the shared link), 0 without dma stages
    copy_engine_exposed_us: float  # the part of it (plus the consumer's last chunk) the kernels do not hide
    predicted_us: float
    bsp_share: float
    locality_share: float
    launch_share: float


def predict(st, m: Machine = H200, entry_barrier: bool = True) -> Prediction:
    """Time of one call of the schedule described by `st` (tilec.perf.taxes.Static) on machine `m`.
    entry_barrier=False: a call that skips the entry and exit barriers (the caller orders calls, as benchmarks do)."""
    by_stage = {c.name: c for c in st.stage_costs}
    phases: list[list] = []  # kernels that run at the same time: concurrent ones together, others alone
    for k in st.kernel_costs:
        if k.concurrent and phases and phases[-1][0].concurrent:
            phases[-1].append(k)
        else:
            phases.append([k])
    compute = comm = core = flags = sm_copy = 0.0
    stage_us: dict[str, float] = {}
    k_len = (st.dims or {}).get("K", 0)  # a GEMM program's K: each task's K loop
    beside = m.dot_beside_copies + m.dot_beside_copies_per_k2 * max(0.0, math.log2(max(k_len, 1) / 4096))
    for ph in phases:
        c_ph = m_ph = busy = 0.0
        for k in ph:
            cs = [by_stage[s] for s in k.stages]
            # specialized kernels run their stages side by side on their own programs; others one task at a time
            shares = [k.share * g for g in k.groups] if k.groups else [k.share] * len(cs)
            times = [_compute_us(c, m, sh) for c, sh in zip(cs, shares, strict=True)]
            if beside != 1.0 and not k.groups and any(_is_copy(c) for c in cs):
                times = [t * beside if c.flops or c.flops_f32 else t for c, t in zip(cs, times, strict=True)]
            stage_us |= {c.name: t for c, t in zip(cs, times, strict=True)}
            c_ph = max(c_ph, max(times) if k.groups else sum(times))
            links = [(c.remote_read_bytes + c.remote_write_bytes) / (m.link_GBps * 1e3) for c in cs]
            # stages in turn: a task holds its program while its remote loads and stores are in flight
            held = [max(t, x) for t, x in zip(times, links, strict=True)]
            busy = max(busy, max(held) if k.groups else sum(held))
            m_ph += sum(links) + (m.link_latency_us if any(links) else 0.0)
            for c, sh in zip(cs, shares, strict=True):
                polls = (c.flag_waits - c.remote_flag_waits) * m.flag_us + c.remote_flag_waits * m.link_latency_us
                flags += polls / max(1.0, m.sms * sh)
        compute, comm, core = compute + c_ph, comm + m_ph, core + max(c_ph, m_ph)
        sm_copy += max(0.0, busy - max(c_ph, m_ph))
    overlap = max(compute, comm)
    serial = core - overlap
    if m.start_skew_us and any(c.flag_waits for c in st.stage_costs):
        flags += m.start_skew_us  # the latest rank's late start, waited out by the first wait on its data
    ce, ce_exposed = copy_engine_us(st, m), 0.0
    if ce:
        chunks = max(1, max((len(r) for r in st.copy_engine_chunks), default=1))
        last = sum(stage_us.get(s, 0.0) for s in st.copy_engine_consumers) / chunks  # the consumer's last chunk
        ce_exposed = max(0.0, ce + last - (core + sm_copy))
    nbar = st.barriers if entry_barrier else st.barriers_between
    # the skew is waited out once per stretch of work: between kernels, and at the entry (or exit) of a call; the
    # ranks' drift (a share of the call's work) once per call that has such a barrier
    skewed = st.barriers_between + (1 if entry_barrier and st.barriers > st.barriers_between else 0)
    barrier = nbar * m.barrier_us + skewed * m.barrier_skew_us + (m.barrier_skew_share * core if skewed else 0.0)
    l2 = m.l2_MB * 1e6
    moved = sum(r.write_bytes - r.ce_write_bytes + r.unique_read_bytes for r in st.roundtrips
                if r.inter_kernel or r.tensor_bytes > l2)
    locality = moved / (m.hbm_GBps * 1e3)
    launch = st.launches * m.launch_us
    total = core + sm_copy + ce_exposed + barrier + locality + launch + flags
    share = (lambda x: x / total) if total else (lambda x: 0.0)
    return Prediction(compute, comm, overlap, serial, barrier, serial + barrier, locality, launch, flags, sm_copy, ce,
                      ce_exposed, total, share(serial + barrier), share(locality), share(launch))


def copy_engine_us(st, m: Machine = H200) -> float:
    """The copy engines' time of one call on the slowest rank: per side stream the sum over its chunks of bytes /
    rate + ce_latency_us per issued copy; the streams run at once, but the peers' bytes share one link."""
    worst = 0.0
    for chunks in st.copy_engine_chunks:
        streams: dict[int, float] = {}
        for c in chunks:
            rate = m.ce_link_GBps if c.peer else m.ce_GBps
            streams[c.stream] = streams.get(c.stream, 0.0) + c.bytes / (rate * 1e3) + c.copies * m.ce_latency_us
        link = sum(c.bytes for c in chunks if c.peer) / (m.ce_link_GBps * 1e3)
        worst = max(worst, max(streams.values(), default=0.0), link)
    return worst


def _is_copy(c) -> bool:
    """A stage that only moves bytes to or from a peer (no Dot): a gather's copy tasks."""
    return not (c.flops or c.flops_f32) and bool(c.remote_read_bytes or c.remote_write_bytes)


def _compute_us(c, m: Machine, share: float) -> float:
    progs = max(1, int(m.sms * share))
    waves = -(-c.tasks // progs) * progs / max(1, c.tasks)  # the last wave of tasks leaves programs idle
    math = (c.flops / (m.gemm_tflops * 1e6) + c.flops_f32 / (m.f32_tflops * 1e6)) / share * waves
    return max(math, c.hbm_bytes / (m.hbm_GBps * 1e3))


# -- calibration (GPU only) ------------------------------------------------------------------------------


def calibrate(base: Machine = H200, log=print) -> Machine:
    """Measure this machine's rates: GEMM (triton.testing.do_bench), device copy (gpu_time.cold_time, a flush
    that leaves no dirty lines to write back), launch latency, the copy engines (a large and a tiny
    cudaMemcpyAsync on a side stream, as runtime/dma.py issues them), host barrier over the visible GPUs and, with two
    or more, a peer copy (do_bench; a cross-device copy is a copy-engine copy, so it gives ce_link_GBps too). Fields
    it cannot measure (flag polls; the link on one GPU) keep `base`'s values."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available():
        raise TilecError("tilec calibrate measures a GPU and none is visible here; without a machine file tilec "
                         "uses the H200 defaults (docs/GPU.md)")
    from triton.testing import do_bench

    from tilec.perf.measure import progress

    dev = torch.device("cuda", 0)
    gpus = torch.cuda.device_count()
    bar = progress(6 if gpus > 1 else 5, "calibrate", log)
    gemm = _gemm_tflops(torch, dev, do_bench)
    bar.step(f"gemm bf16 8192^3: {gemm:.0f} TFLOP/s")
    hbm = _copy_GBps(torch, dev)
    bar.step(f"device copy: {hbm:.0f} GB/s (read + write)")
    launch = _launch_us(torch)
    bar.step(f"launch: {launch:.1f} us")
    ce, ce_lat = _copy_engine(torch, dev)
    bar.step(f"copy engine: {ce:.0f} GB/s (bytes copied), {ce_lat:.1f} us per issued copy")
    out = replace(base, name=f"{torch.cuda.get_device_name(dev)} (calibrated)", gemm_tflops=round(gemm, 1),
                  hbm_GBps=round(hbm, 1), launch_us=round(launch, 2), ce_GBps=round(ce, 1),
                  ce_latency_us=round(ce_lat, 2), sms=torch.cuda.get_device_properties(dev).multi_processor_count)
    if gpus > 1:
        link = _peer_copy_GBps(torch)
        bar.step(f"peer copy 0 -> 1 (copy engine): {link:.0f} GB/s")
        out = replace(out, link_GBps=round(link, 1), ce_link_GBps=round(link, 1))
    else:
        log("  one GPU: link bandwidth and latency, and the copy engines' peer rate, keep their defaults")
    out = replace(out, barrier_us=round(_barrier_us(gpus), 1))
    bar.step(f"host barrier over {gpus} GPU(s): {out.barrier_us:.1f} us")
    bar.close()
    return out


def _gemm_tflops(torch, dev, do_bench, n: int = 8192) -> float:
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    return 2 * n**3 / (do_bench(lambda: a @ b, warmup=25, rep=200) * 1e-3) / 1e12


def _copy_GBps(torch, dev) -> float:
    from tilec.perf.gpu_time import cold_time

    x = torch.empty(1 << 29, device=dev, dtype=torch.uint8)
    y = torch.empty_like(x)
    return 2 * x.numel() / cold_time(lambda: y.copy_(x), reps=100, warmup=10) / 1e9


def _copy_engine(torch, dev, n: int = 200) -> tuple[float, float]:
    """(GB/s of a 512 MB device-to-device copy, us per tiny copy) through cudaMemcpyAsync on a side stream, timed
    with CUDA events on that stream: the calls runtime/dma.py issues for transport=dma. The tiny copies (4 bytes, a
    chunk's flag write) go back to back, so their time per copy is the driver's issue plus the engine's start."""
    import ctypes

    from tilec.runtime.dma import _DEFAULT, _cudart

    rt = _cudart()
    rt.cudaSetDevice(dev.index or 0)
    x = torch.empty(1 << 29, device=dev, dtype=torch.uint8)
    y = torch.empty_like(x)
    side = torch.cuda.Stream(device=dev)
    h = ctypes.c_void_p(side.cuda_stream)

    def timed(nbytes: int, reps: int) -> float:
        torch.cuda.synchronize(dev)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(side)
        for _ in range(reps):
            if rt.cudaMemcpyAsync(y.data_ptr(), x.data_ptr(), nbytes, _DEFAULT, h):
                raise TilecError("tilec calibrate: a cudaMemcpyAsync on a side stream failed")
        end.record(side)
        end.synchronize()
        return start.elapsed_time(end) * 1e-3 / reps  # seconds per copy

    timed(x.numel(), 2)  # warm-up
    big = min(timed(x.numel(), 5) for _ in range(3))
    timed(4, 20)
    tiny = min(timed(4, n) for _ in range(3))
    return x.numel() / big / 1e9, tiny * 1e6


def _launch_us(torch, n: int = 2000) -> float:
    import time

    import triton
    import triton.language as tl

    @triton.jit
    def _noop(x, N: tl.constexpr):
        tl.store(x + tl.arange(0, N), tl.arange(0, N))

    buf = torch.empty(16, device="cuda", dtype=torch.int32)
    for _ in range(10):
        _noop[(1,)](buf, 16)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        _noop[(1,)](buf, 16)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def _peer_copy_GBps(torch) -> float:
    from triton.testing import do_bench

    x = torch.empty(1 << 28, device="cuda:0", dtype=torch.uint8)
    y = torch.empty(1 << 28, device="cuda:1", dtype=torch.uint8)
    ms = do_bench(lambda: y.copy_(x), warmup=5, rep=50)
    return x.numel() / (ms * 1e-3) / 1e9


def _barrier_us(gpus: int) -> float:
    """The barrier generated code uses (heap.barrier: device sync + gloo), one rank per GPU."""
    from tilec.runtime import spawn

    return max(spawn("tilec.perf.model:_barrier_rank", max(1, gpus), backend="iris", heap_bytes=1 << 24, timeout=300))


def _barrier_rank(heap, n: int = 200) -> float:
    import time

    for _ in range(10):
        heap.barrier()
    t0 = time.perf_counter()
    for _ in range(n):
        heap.barrier()
    return (time.perf_counter() - t0) / n * 1e6
