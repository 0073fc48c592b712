"""The render model: a generated module as plain strings and numbers, which the jinja2 template only prints."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TaskFn:
    """One stage's task body as a device function (merged kernels call one per stage, so each stage's names
    stay its own: Triton wants a name bound in both branches of an `if` to keep one type)."""

    name: str
    signature: tuple[str, ...]  # the `def` line(s)
    lines: tuple[str, ...]


@dataclass(frozen=True)
class KernelModel:
    name: str
    stages: tuple[str, ...]
    params: tuple[str, ...]  # the buffers passed first, in order (tensor and flag names)
    signature: tuple[str, ...]  # the `def` line(s)
    lines: tuple[str, ...]  # body of the persistent loop, indented relative to it
    total: int
    persistent: bool
    concurrent: bool
    barrier_before: bool
    share: float  # fraction of the co-resident programs this kernel takes when launched concurrently
    groups: int  # > 0: workgroup-specialized, one program group per stage (the body holds its own loops)
    tasks: tuple[TaskFn, ...] = ()
    row: tuple[str, ...] = ()  # its line(s) of the KERNELS table


@dataclass(frozen=True)
class FlagModel:
    name: str
    param: str
    size: int
    count: int
    producer: str
    key: str
    number: int


@dataclass(frozen=True)
class TensorModel:
    name: str
    kind: str
    dtype: str
    shape: tuple[int, ...]
    symmetric: bool


@dataclass(frozen=True)
class ModuleModel:
    header: tuple[str, ...]
    source: str  # the .tile file
    program: str
    world: int
    schedule: str
    tensors: tuple[TensorModel, ...]
    flags: tuple[FlagModel, ...]
    kernels: tuple[KernelModel, ...]
    num_warps: int
    num_stages: int
    exit_barrier: bool
    timeline_slots: int = 0  # > 0: a timeline build, one record per task of every kernel
    kernel_slots: tuple[int, ...] = ()  # a timeline build: each kernel's records (its stages' tasks, folded ones too)
    noinline_tasks: bool = False  # merged kernels call their stages' task functions instead of inlining them
    uses_iris: bool = False  # a load translates addresses with iris.load (a pulled tile that straddles ranks)
    dma: tuple[str, ...] = ()  # the DMA_COPIES table's lines (codegen/dma.py); empty: no stage on the copy engines
    device_module: str = "tilec.device"  # what the module imports as td (tilec.device_nvshmem for backend nvshmem)
    backend: str = "iris"  # how kernels reach peers (settings.BACKENDS); the module's BACKEND where not iris
    ranks_per_node: int = 0  # backend nvshmem: ranks reaching each other by pointer (RANKS_PER_NODE)
    wait_sleep_ns: int = 0  # > 0: flag waits sleep this long between polls (`td` is tilec.device.with_wait_sleep's)

