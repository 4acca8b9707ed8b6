"""The embedded CPU mode: the whole algorithm end to end on a laptop, no verl, no Ray, no GPU.

``task`` (the synthetic arithmetic task, graded by level), ``tiny_model`` (a small Qwen2 and its byte-level
tokenizer, built locally), ``runner`` (the training loop, ``python -m exgrpo.embedded.runner``) and
``twin_assets`` (the warm-started model and task files the verl twin of every GPU script runs on).
"""
