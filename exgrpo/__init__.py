"""ExGRPO: GRPO that learns from its own experience (Zhan et al., arXiv 2510.02245).

``exgrpo.algorithm`` (the algorithm, verl-free), ``exgrpo.verifier`` (the 0/1 reward verl calls),
``exgrpo.embedded`` (the CPU mode: runner, tiny model, synthetic task, assets of the verl twin) and
``exgrpo.tools`` (pool inspector, benchmark scorer); the verl recipe is ``recipe/exgrpo``. The direction of
imports is fixed (``tests/test_layout.py``): the algorithm imports nothing of the rest.
"""

__version__ = "0.1.0"
