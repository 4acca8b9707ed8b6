"""The paper's reported results, and the paper's table layout that a checkpoint's scores are written in.

Numbers as the paper reports them (Zhan et al., arXiv 2510.02245: its main table for Qwen2.5-Math-7B and the LUFFY
continual runs, its model-extension table for the other backbones; pass@1 in %, avg@32 for AIME24/25 and AMC,
temperature 0.6). They are the paper's figures, never measured here; ``layout_table`` marks them so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# data_source of each benchmark (the names data_preprocess/ writes, and the authors' processed files use)
IN_DISTRIBUTION = ("aime", "aime25", "amc", "math", "minerva", "olympiad_bench")
OUT_OF_DISTRIBUTION = ("arc_c", "gpqa", "mmlu_pro")
COLUMN_NAMES = {"aime": "AIME24", "aime25": "AIME25", "amc": "AMC", "math": "MATH-500", "minerva": "Minerva",
                "olympiad_bench": "Olympiad", "arc_c": "ARC-c", "gpqa": "GPQA-diamond", "mmlu_pro": "MMLU-Pro"}

# backbone -> method -> (the six in-distribution scores, their average, the three OOD scores, their average)
_REPORTED: dict[str, dict[str, tuple[float, ...]]] = {
    "qwen2.5-math-7b": {
        "Qwen2.5-Math-7B (base)": (11.5, 4.9, 31.3, 43.6, 7.4, 15.6, 19.0, 18.2, 11.1, 16.9, 15.4),
        "On-Policy": (24.9, 15.5, 59.2, 84.8, 38.2, 49.3, 45.3, 82.6, 37.4, 49.2, 56.4),
        "ExGRPO": (31.6, 18.7, 66.3, 87.4, 36.0, 50.1, 48.3, 84.7, 37.4, 52.9, 58.3),
    },
    "luffy-qwen-math-7b": {
        "LUFFY": (29.4, 23.1, 65.6, 87.6, 37.5, 57.2, 50.1, 80.5, 39.9, 53.0, 57.8),
        "Continual LUFFY": (30.7, 22.5, 66.2, 86.8, 41.2, 55.3, 50.4, 81.8, 49.0, 54.7, 61.8),
        "On-Policy": (24.8, 17.8, 67.5, 88.4, 38.6, 55.3, 48.7, 81.9, 47.0, 53.3, 60.7),
        "ExGRPO": (32.3, 25.7, 65.6, 87.6, 40.1, 57.0, 51.4, 83.6, 42.4, 54.5, 60.2),
    },
    "qwen2.5-math-1.5b": {
        "Qwen2.5-Math-1.5B (base)": (7.2, 3.6, 26.4, 28.0, 9.6, 21.2, 16.0, 3.1, 3.0, 2.3, 2.8),
        "On-Policy": (11.8, 7.7, 40.2, 61.8, 26.8, 32.0, 30.0, 57.5, 28.3, 30.7, 38.9),
        "ExGRPO": (13.3, 8.6, 46.6, 74.0, 30.5, 39.0, 35.3, 59.3, 30.8, 30.4, 40.2),
    },
    "qwen2.5-7b-instruct": {
        "Qwen2.5-7B-Instruct": (11.7, 7.5, 43.8, 71.8, 30.9, 40.4, 34.4, 84.7, 24.7, 54.7, 54.7),
        "On-Policy": (14.1, 8.3, 43.5, 74.0, 33.8, 37.6, 35.2, 91.4, 19.2, 57.6, 56.0),
        "ExGRPO": (15.2, 12.4, 47.8, 80.0, 36.0, 44.4, 39.3, 91.1, 36.9, 58.6, 62.2),
    },
    "llama3.1-8b": {
        "Llama3.1-8B (base)": (0.0, 0.0, 4.7, 11.0, 4.4, 1.9, 3.7, 0.2, 0.0, 3.6, 1.3),
        "On-Policy": (0.4, 0.4, 2.9, 9.2, 5.1, 2.8, 3.4, 0.6, 0.0, 3.0, 1.2),
        "ExGRPO": (0.7, 0.1, 6.6, 12.0, 10.7, 6.5, 6.1, 59.0, 7.1, 26.2, 30.8),
    },
    "llama3.1-8b-instruct": {
        "Llama3.1-8B-Instruct": (4.0, 0.3, 15.7, 39.8, 18.0, 13.3, 15.2, 42.4, 0.0, 40.5, 27.6),
        "On-Policy": (3.8, 0.8, 21.4, 49.8, 24.3, 19.6, 19.9, 86.7, 0.0, 48.1, 44.9),
        "ExGRPO": (6.1, 0.6, 27.1, 55.2, 25.7, 23.1, 23.0, 88.9, 15.2, 52.1, 52.0),
    },
}
BACKBONES = tuple(_REPORTED)
# how a backbone shows in a checkpoint's path (run script names, model folder names), most specific first
_PATH_MARKERS = (("luffy", "luffy-qwen-math-7b"), ("qwen2.5-math-1.5b", "qwen2.5-math-1.5b"),
                 ("qwen2.5-math-7b", "qwen2.5-math-7b"), ("qwen2.5-7b-instruct", "qwen2.5-7b-instruct"),
                 ("llama3.1-8b-instruct", "llama3.1-8b-instruct"), ("llama3.1-8b", "llama3.1-8b"))
KEYS = (*IN_DISTRIBUTION, "in_distribution_avg", *OUT_OF_DISTRIBUTION, "ood_avg")


def rows_for(backbone: str) -> dict[str, dict[str, float]]:
    """The paper's rows for ``backbone``: method -> {data_source or average key: score}."""
    return {method: dict(zip(KEYS, values, strict=True)) for method, values in _REPORTED[backbone].items()}


def backbone_of(path: str) -> str | None:
    """The backbone a checkpoint's path names (``checkpoints/exgrpo/qwen2.5_math_7b_exgrpo/global_step_700``), or
    None. The run scripts' names use ``_`` where the model names use ``-``."""
    text = path.lower().replace("_", "-")
    return next((backbone for marker, backbone in _PATH_MARKERS if marker in text), None)


def _cell(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def layout_table(summary: Mapping[str, Any], label: str, backbone: str | None) -> str:
    """This checkpoint's row in the paper's layout (nine benchmarks, two averages), then the paper's rows for
    ``backbone``, each marked as reported by the paper. An average over fewer benchmarks than the paper's says so."""
    header = ["model", *(COLUMN_NAMES[k] for k in IN_DISTRIBUTION), "ID avg",
              *(COLUMN_NAMES[k] for k in OUT_OF_DISTRIBUTION), "OOD avg"]
    benchmarks = summary["benchmarks"]
    cells = [f"**{label}** (measured, {summary['protocol']} protocol)"]
    cells += [_cell(benchmarks[k]["score"] if k in benchmarks else None) for k in IN_DISTRIBUTION]
    average = _cell(summary.get("in_distribution_avg"))
    count = summary.get("in_distribution_count", len(IN_DISTRIBUTION))
    cells.append(average if count in (0, len(IN_DISTRIBUTION)) else f"{average} ({count} of {len(IN_DISTRIBUTION)})")
    cells += [_cell(benchmarks[k]["score"] if k in benchmarks else None) for k in OUT_OF_DISTRIBUTION]
    average = _cell(summary.get("ood_avg"))
    count = summary.get("ood_count", len(OUT_OF_DISTRIBUTION))
    cells.append(average if count in (0, len(OUT_OF_DISTRIBUTION)) else
                 f"{average} ({count} of {len(OUT_OF_DISTRIBUTION)})")
    lines = ["| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|", "| " + " | ".join(cells) + " |"]
    if backbone:
        for method, values in rows_for(backbone).items():
            lines.append("| " + " | ".join([f"{method}, {backbone} (paper, reported)",
                                            *(_cell(values[k]) for k in KEYS)]) + " |")
    note = ("" if backbone else "\nNo paper rows: the checkpoint's path names none of the paper's backbones "
            f"({', '.join(BACKBONES)}); pass --backbone (BACKBONE=) to choose one.\n")
    return "\n".join(lines) + "\n" + note
