"""GPU tests: `--world W` keeps the tests that launch W ranks (a `world` parameter, or `@pytest.mark.world(W)`), as
an MPS world of W ranks on one GPU runs them (benchmarks/runs/mps_world.sh --spawn W python -m pytest ... --world W);
tests of one process on the GPU count as world 1."""

from __future__ import annotations


def pytest_addoption(parser):
    parser.addoption("--world", type=int, default=None, metavar="W",
                     help="GPU tests: run only the tests that launch W ranks (an MPS world of W on one GPU)")


def pytest_configure(config):
    config.addinivalue_line("markers", "world(n): the test launches n ranks (for --world)")


def launched_world(item) -> int:
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "world" in callspec.params:
        return int(callspec.params["world"])
    mark = item.get_closest_marker("world")
    return int(mark.args[0]) if mark else 1



def pytest_collection_modifyitems(config, items):
    want = config.getoption("--world")
    if want is None:
        return
    keep, drop = [], []
    for item in items:
        (keep if launched_world(item) == want else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
