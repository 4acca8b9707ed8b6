"""Test-only custom reward for verl (loaded by file path): 1 when the response's leading digits are the answer."""

import re


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    leading = re.match(r"\d*", solution_str).group(0)
    score = 1.0 if leading == str(ground_truth) else 0.0
    return {"score": score, "leading": leading}
