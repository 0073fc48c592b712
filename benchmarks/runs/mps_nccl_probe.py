"""Whether NCCL runs W ranks on one GPU under MPS (the all_gather_into_tensor + matmul baseline needs it).

  timeout 90 sh benchmarks/runs/mps_world.sh --spawn 2 python3 benchmarks/runs/mps_nccl_probe.py 2

Each rank: init_process_group("nccl") on cuda:0, one all_gather_into_tensor, then prints what happened (the error,
or the gathered values). A rank that has not finished after 45 s is reported as hung."""

import multiprocessing as mp
import os
import sys
import traceback


def _rank(rank: int, world: int, port: int, q) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      NCCL_DEBUG="WARN")
    try:
        import torch
        import torch.distributed as dist

        torch.cuda.set_device(0)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda:0"))
        x = torch.full((4,), float(rank), device="cuda")
        out = torch.empty(4 * world, device="cuda")
        dist.all_gather_into_tensor(out, x)
        torch.cuda.synchronize()
        q.put((rank, f"ok: {out.tolist()}"))
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001 - the answer is the error
        q.put((rank, f"{type(e).__name__}: {str(e).strip()[:600]}\n{traceback.format_exc(limit=2)[-400:]}"))


if __name__ == "__main__":
    world = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, world, 29533, q)) for r in range(world)]
    for p in procs:
        p.start()
    got = {}
    try:
        for _ in range(world):
            r, msg = q.get(timeout=45)
            got[r] = msg
    except Exception:  # noqa: BLE001 - queue.Empty: a rank hung
        pass
    for r in range(world):
        print(f"rank {r}: {got.get(r, 'no answer within 45 s (hung in NCCL init or the collective)')}", flush=True)
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
