"""ExGRPO: GRPO that learns from its own experience (Zhan et al., arXiv 2510.02245).

The core modules are verl-free and import nothing heavy at package import time:
``config`` (knobs), ``sampling`` (bucket weighting), ``pool`` (experience pool), ``selection`` (entropy
choice), ``objective`` (shaped loss), ``advantage`` (GRPO over mixed groups), ``reward`` (verifier).
"""

__version__ = "0.1.0"
