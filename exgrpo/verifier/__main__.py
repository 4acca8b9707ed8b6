"""``python -m exgrpo.verifier``: the worker pool's cost per call, against grading in this process."""

import json

from exgrpo.verifier.grading import measure_overhead

print(json.dumps(measure_overhead(), indent=1))
