"""A program may not name its dims, tiles, tensors or loop variables as the generated kernels name their own values
(the task number `t`, the rank, the heap): a located error, where a loop variable `t` beside another loop used to
be decoded from the task number's own name and read the wrong rows."""

import pytest

from tilec.api import compile as tilec_compile
from tilec.errors import CompileError
from tilec.ir.reserved import KERNEL_NAMES, RESERVED

PROGRAM = """\
program clash(world W)
  dims  T = 16, D = 16
  tiles BT = 8, BD = 16

  in  Z : f32[T, D] symmetric
  out Y : f32[W*T, D]

  stage g over r in ranks, u in T by BT, d in D by BD:
    Y[r*T + u, d] = Z@r[u, d]
"""


def _compile(src: str, tmp_path, name: str = "clash"):
    path = tmp_path / f"{name}.tile"
    path.write_text(src)
    return tilec_compile(str(path), world=2, schedule="bsp")


@pytest.mark.parametrize("old, new, where, what", [
    ("u in T by BT", "t in T by BT", "8:28", "loop variable 't'"),
    ("u in T by BT", "task in T by BT", "8:28", "loop variable 'task'"),
    ("u in T by BT", "_peer0 in T by BT", "8:28", "loop variable '_peer0'"),
    ("dims  T = 16", "dims  pid = 16", "2:9", "dim 'pid'"),
    ("tiles BT = 8", "tiles epoch = 8", "3:9", "tile size 'epoch'"),
    ("in  Z : f32", "in  heap_bases : f32", "5:3", "tensor 'heap_bases'"),
])
def test_reserved_names_are_located_errors(tmp_path, old, new, where, what):
    src = PROGRAM.replace(old, new)
    if "pid" in new:
        src = src.replace("T,", "pid,").replace("W*T", "W*pid").replace("in T by", "in pid by").replace("r*T", "r*pid")
    if "epoch" in new:
        src = src.replace("by BT", "by epoch")
    if "heap_bases" in new:
        src = src.replace("Z@r", "heap_bases@r")
    if new.split()[0] in ("t", "task", "_peer0"):
        var = new.split()[0]
        src = src.replace("r*T + u", f"r*T + {var}").replace("[u, d]", f"[{var}, d]")
    with pytest.raises(CompileError) as info:
        _compile(src, tmp_path)
    text = info.value.render()
    assert f"clash.tile:{where}: error: {what} is a name " in text, text
    assert "^" in text


def test_the_program_with_its_own_names_compiles(tmp_path):
    prog = _compile(PROGRAM, tmp_path)
    assert "def " in prog.source


def test_reserved_names_cover_the_kernel_names():
    assert KERNEL_NAMES <= RESERVED and {"t", "task", "rank", "range"} <= RESERVED
