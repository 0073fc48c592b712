"""Size limits of .tile programs, checked before anything is allocated or recursed over.

Each is far beyond what a real program on today's GPUs uses (an H200 holds 141 GB: 2**36 f16 elements) and far
below what breaks the compiler (Python's recursion limit, NumPy's array limits, Triton's largest block).
"""

MAX_WORLD = 1024  # ranks
MAX_LITERAL = 2**40  # an integer literal
MAX_SIZE = 2**40  # a dim, a tensor dimension, a tensor's elements
# elements of one tile: Triton materializes at most 2**20 in one block (TRITON_MAX_TENSOR_NUMEL), but a tile that
# codegen streams (the keys of an attend, in blocks of attend_block) may be larger: 1M-key decode splits use 2**21
MAX_TILE = 2**24
MAX_TASKS = 2**24  # tasks of one stage, trips of one reduction
MAX_LOOPS = 32  # loops of one stage, `:` slices included (NumPy arrays have at most 64 dims)
MAX_SOURCE = 2**16  # characters of one program (real ones have a few thousand; lark parses ~20K a second)
MAX_DEPTH = 64  # nesting of operators, calls and sums in one expression (Python and Triton recurse over it)
