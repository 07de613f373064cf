"""tfd: a serving daemon for hybrid linear-attention language models.

docs/architecture.md has its terms, its layers, a line a module and the walk of a request.
"""

import os

# MKL (torch's CPU BLAS) may sum a product in an order that follows its operands' memory alignment, so
# one checkpoint saved whole and sharded gave different bits on an AMD EPYC; strict conditional
# reproducibility makes the CPU path's bits independent of where tensors lie. Set before torch's first
# product (this package imports torch only after it); a value already in the environment is kept.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

__version__ = "0.1.0"
