"""Make the repository importable when tilec is not installed (pytest's default rootdir-less sys.path).

Rank processes inherit sys.path from the parent, so they can import tilec and the helper modules here.
"""

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
