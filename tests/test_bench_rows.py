"""The bench's row arithmetic on fake timings: which baseline is the bar, ratios device time against device time,
the floor's fraction; references and floors never become the bar."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tilec.perf.measure import spread
from tilec.perf.rows import best_baseline, best_tilec, finish_shape


@dataclass
class R:
    name: str
    kind: str
    device_us: float
    host_us: float = 0.0


def test_best_baseline_is_the_fastest_fair_one():
    rows = [R("floor", "floor", 50.0), R("nccl+cublas", "baseline", 120.0), R("async-tp", "baseline", 100.0),
            R("naive torch", "reference", 20.0), R("matmul (no comm)", "reference", 60.0),
            R("fused-push", "tilec", 80.0), R("bsp", "tilec", 160.0)]
    finish_shape(rows)
    assert best_baseline(rows).name == "async-tp"  # references are faster but never the bar
    assert best_tilec(rows).name == "fused-push"
    ratios = {r.name: r.ratio_to_best_baseline for r in rows}
    assert ratios["fused-push"] == pytest.approx(100 / 80) and ratios["bsp"] == pytest.approx(100 / 160)
    assert ratios["async-tp"] == 1.0
    assert all(r.best_baseline == "async-tp" and r.floor_us == 50.0 for r in rows)
    assert {r.name: r.frac_of_floor for r in rows}["fused-push"] == pytest.approx(50 / 80)


def test_ratios_use_device_time_not_host_time():
    rows = [R("sdpa", "baseline", 30.0, host_us=60.0), R("fused-push", "tilec", 40.0, host_us=45.0)]
    finish_shape(rows, floor_us=20.0)
    assert rows[1].ratio_to_best_baseline == pytest.approx(30 / 40)  # slower on the device, whatever the host
    assert rows[1].frac_of_floor == pytest.approx(0.5) and rows[0].floor_us == 20.0


def test_a_floor_row_wins_over_a_given_floor_and_no_baseline_means_no_ratio():
    rows = [R("floor", "floor", 10.0), R("bsp", "tilec", 40.0)]
    finish_shape(rows, floor_us=99.0)
    assert rows[1].floor_us == 10.0 and rows[1].ratio_to_best_baseline is None and rows[1].best_baseline is None


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="kind"):
        finish_shape([R("x", "fast", 1.0)])


def test_spread_is_median_and_nearest_rank_percentiles():
    med, p10, p90, lo, hi = spread([float(x) for x in range(1, 21)])
    assert (med, lo, hi) == (10.5, 1.0, 20.0)
    assert p10 == 3.0 and p90 == 18.0
    with pytest.raises(ValueError):
        spread([])


def test_rel_err_never_lets_a_nan_or_a_wrong_shape_pass():
    import torch

    from tilec.perf.rows import rel_err

    ref = torch.tensor([[1.0, -2.0], [4.0, 0.5]])
    assert rel_err(ref + 0.04, ref) == pytest.approx(0.01)
    assert rel_err(ref, None) is None
    assert rel_err(torch.full_like(ref, float("nan")), ref) == float("inf")
    assert rel_err(ref.T.reshape(4), ref) == float("inf")
    assert rel_err(torch.zeros(0), torch.zeros(0)) == 0.0
