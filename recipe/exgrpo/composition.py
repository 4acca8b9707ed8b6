"""verl's side of a step's composition: the question id of a dataset row, and the fresh stream over verl's rows.

The rules themselves (B distinct questions, deferral, the replay draw) are the core's
(:mod:`exgrpo.algorithm.composition`); what is verl's is the row format (``extra_info.qid``, ``raw_prompt``) and
the dataloader that supplies the rows.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any

from exgrpo.algorithm.composition import FreshStream

QID_KEY = "qid"


def question_id(row: Mapping[str, Any]) -> str:
    """Stable id of a dataset row: ``extra_info["qid"]`` when the preprocessing wrote one.

    Otherwise a hash of data_source and the prompt messages, so the same question gets the same id in every
    epoch and after a restart (verl's own ``extra_info.index`` defaults to 0 for every row, so it cannot be
    used).
    """
    extra_info = row.get("extra_info") or {}
    if not isinstance(extra_info, Mapping):
        raise ValueError(f"row extra_info must be a mapping, got {type(extra_info).__name__}")
    qid = extra_info.get(QID_KEY)
    if qid is not None and str(qid) != "":
        return str(qid)
    prompt = row.get("raw_prompt", row.get("prompt"))
    if prompt is None:
        raise ValueError("row has neither extra_info.qid nor a raw_prompt/prompt to derive a question id from")
    text = json.dumps(_jsonable(prompt), sort_keys=True, ensure_ascii=False)
    digest = hashlib.sha1(f"{row.get('data_source', '')}\x00{text}".encode()).hexdigest()
    return f"h{digest[:20]}"


def _jsonable(value: Any) -> Any:
    """numpy arrays / tuples from parquet as plain lists, so equal prompts hash equally."""
    if hasattr(value, "tolist") and not isinstance(value, str | bytes):
        value = value.tolist()
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def dataset_stream(next_row: Callable[[], dict[str, Any]], dataset_size: int) -> FreshStream:
    """The fresh-question stream over verl dataset rows (``next_row`` gives one row per call, epochs repeating)."""
    return FreshStream(next_row, question_id, dataset_size)
