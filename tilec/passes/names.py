"""The names of the schedules, passes and transports, in a module that imports nothing: the command line offers them
as choices without importing a pass, so `tilec --help` and `--version` stay quick and load no torch, triton or iris.
schedules.py and transport.py take their names from here."""

SCHEDULES = ("bsp", "flags", "fused-pull", "fused-push", "specialized")

DESCRIPTIONS = {
    "bsp": "one kernel per stage, a global barrier where the program has one (the baseline)",
    "flags": "one persistent kernel per stage on its own stream, per-tile flags instead of barriers",
    "fused-pull": "consumers read the copy's source from peers directly; the buffer and its stage disappear",
    "fused-push": "owners store tiles into peers and release their flags; one persistent kernel",
    "specialized": "one persistent kernel, each stage on programs of its own (communication vs compute), flags",
}

PASS_NAMES = ("lower", "fuse-comm", "replace-barriers", "transport", "local-in-place", "coarsen-copies", "persist",
              "fold-last", "codegen")

TRANSPORTS = ("sm", "dma", "auto")
