"""Command-line tools around a run: ``inspect_pool`` (what a saved experience pool holds) and ``evaluate``
(score a model's responses on the math and out-of-distribution benchmarks)."""
