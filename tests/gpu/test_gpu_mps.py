"""GPU: how many programs of a persistent grid, sized as tilec sizes one (programs per SM that fit, times the SMs the
rank has), are resident at once on every rank sharing the GPU. With a GPU per rank (or one rank) all are, so no wait
on a program of the same or a peer's grid can hang. Ranks side by side under MPS (benchmarks/runs/mps_world.sh
--spawn W ... --world W) each see their share of the SMs, but a grid that fills its SMs was seen not all resident
beside its peers' (one rank's programs timed out waiting for the others'): there tilec's persistent loops claim
their tasks (LaunchContext.claim, tilec.device.first_task), so programs still off the GPU hold no task back. Ranks
that time-slice one GPU without MPS are never resident together: skipped."""

import pytest
import torch

from tilec.runtime import spawn

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]


@pytest.mark.parametrize("warps", [4, 32])  # 2 programs of 32 warps fill an SM's 2048 threads; of 4, a quarter
@pytest.mark.parametrize("world", [1, 2, 4])
def test_persistent_grids_are_resident_or_claim_their_tasks(world, warps):
    from tilec.runtime.launch import mps_client

    if world > torch.cuda.device_count() and not mps_client():
        pytest.skip("ranks time-slice the GPU (no MPS): their grids are never resident together, by design")
    res = spawn("tests.gpu.mps_workers:resident", world, backend="iris", heap_bytes=1 << 22, timeout=120,
                args=(warps,))
    side_by_side = world > torch.cuda.device_count() and all(x["mps"] for x in res)
    for r, x in enumerate(res):
        print(f"world {world}, {warps} warps: rank {r}: {x['sms']} SMs, {x['per_sm']} per SM, {x['nprog']} programs "
              f"on {len(x['smids'])} distinct SM ids; all resident with the peers': {not x['timed_out']}; MPS client:"
              f" {x['mps']}, claims: {x['claim']}")
        assert x["nprog"] == x["sms"] * x["per_sm"] and len(x["smids"]) <= x["sms"], (r, x)
        if side_by_side:
            assert x["claim"], (r, x)  # residency is not guaranteed there: the loops must not rely on it
        else:
            assert x["timed_out"] == 0, (r, x)  # every program of every rank arrived while all were spinning
