"""The paper's reported results, and the paper's table layout that a checkpoint's scores are written in.

Numbers as the paper reports them (Zhan et al., arXiv 2510.02245: its main table for Qwen2.5-Math-7B and the LUFFY
continual runs, its model-extension table for the other backbones; pass@1 in %, avg@32 for AIME24/25 and AMC,
temperature 0.6). They are the paper's figures, never measured here; ``layout_table`` marks them so.

A measured column is comparable with them only on the authors' rows: ``AUTHORS_ROWS`` holds each benchmark's
questions and samples as the authors' files give them, and ``layout_table`` marks a column measured on other rows
(another AMC set, a ``QUESTIONS``/``SAMPLES`` slice) and every average that takes it in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# data_source of each benchmark (the names data_preprocess/ writes, and the authors' processed files use)
IN_DISTRIBUTION = ("aime", "aime25", "amc", "math", "minerva", "olympiad_bench")
OUT_OF_DISTRIBUTION = ("arc_c", "gpqa", "mmlu_pro")
COLUMN_NAMES = {"aime": "AIME24", "aime25": "AIME25", "amc": "AMC", "math": "MATH-500", "minerva": "Minerva",
                "olympiad_bench": "Olympiad", "arc_c": "ARC-c", "gpqa": "GPQA-diamond", "mmlu_pro": "MMLU-Pro"}

# data_source -> (questions, samples of each) in the authors' evaluation files, counted in ../shared/data/benchmarks:
# math_test.parquet (6,023 rows: AIME24 and AIME25 30 x 32, AMC 2022 + 2023 83 x 32, MATH-500, Minerva, OlympiadBench),
# arc_c_test.parquet, gpqa_diamond_test.parquet. None: the authors' MMLU-Pro file is not among them, so its rows
# cannot be checked.
AUTHORS_ROWS: dict[str, tuple[int, int] | None] = {
    "aime": (30, 32), "aime25": (30, 32), "amc": (83, 32), "math": (500, 1), "minerva": (272, 1),
    "olympiad_bench": (675, 1), "arc_c": (1172, 1), "gpqa": (198, 1), "mmlu_pro": None}
NOT_COMPARABLE, UNCHECKED = "†", "?"

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


def rows_text(questions: int, k_min: int, k_max: int | None = None) -> str:
    """``questions × samples`` (``30 × 32``; ``30 × 1-32`` where questions have different numbers of samples)."""
    k_max = k_min if k_max is None else k_max
    return f"{questions} × {k_min if k_min == k_max else f'{k_min}-{k_max}'}"


def comparability(benchmarks: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Each measured benchmark's rows beside the authors', and whether its score (and each average) is comparable.

    ``comparable`` is True on the authors' questions × samples, False on other rows, None where the authors' rows are
    not known here (MMLU-Pro, benchmarks of our own). An average is False when a column it takes in is False or one
    of its columns is missing, None when one is unchecked. Counts only: the same number of other questions passes.
    """
    per_source = {}
    for source, row in benchmarks.items():
        authors = AUTHORS_ROWS.get(source)
        same = None if authors is None else (row["questions"], row["k_min"], row["k_max"]) == (authors[0], authors[1],
                                                                                               authors[1])
        per_source[source] = {"rows": rows_text(row["questions"], row["k_min"], row["k_max"]),
                              "authors_rows": None if authors is None else rows_text(*authors), "comparable": same}

    def average(names: tuple[str, ...]) -> bool | None:
        marks = [per_source[name]["comparable"] if name in per_source else False for name in names]
        return False if False in marks else None if None in marks else True

    return {"benchmarks": per_source, "in_distribution_avg": average(IN_DISTRIBUTION),
            "ood_avg": average(OUT_OF_DISTRIBUTION)}


def _cell(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def layout_table(summary: Mapping[str, Any], label: str, backbone: str | None) -> str:
    """This checkpoint's row in the paper's layout (nine benchmarks, two averages), its rows (questions × samples)
    beside the authors', then the paper's rows for ``backbone``, each marked as reported by the paper.

    A score measured on other rows than the authors' is marked †, and so is an average that takes one in; a
    footnote names them. An average over fewer benchmarks than the paper's says so."""
    header = ["model", *(COLUMN_NAMES[k] for k in IN_DISTRIBUTION), "ID avg",
              *(COLUMN_NAMES[k] for k in OUT_OF_DISTRIBUTION), "OOD avg"]
    benchmarks = summary["benchmarks"]
    checked = comparability(benchmarks)
    rows = checked["benchmarks"]

    def score(source: str) -> str:
        if source not in benchmarks:
            return _cell(None)
        mark = {False: f" {NOT_COMPARABLE}", None: f" {UNCHECKED}"}.get(rows[source]["comparable"], "")
        return _cell(benchmarks[source]["score"]) + mark

    def average(key: str, names: tuple[str, ...]) -> str:
        text = _cell(summary.get(f"{key}_avg"))
        count = summary.get(f"{key}_count", len(names))
        text = text if count in (0, len(names)) else f"{text} ({count} of {len(names)})"
        marked = any(rows[name]["comparable"] is False for name in names if name in rows)
        return f"{text} {NOT_COMPARABLE}" if marked else text

    def sizes(source: str) -> str:
        authors = AUTHORS_ROWS[source]
        theirs = UNCHECKED if authors is None else rows_text(*authors)
        return f"{rows[source]['rows'] if source in rows else _cell(None)} ({theirs})"

    cells = [f"**{label}** (measured, {summary['protocol']} protocol)", *(score(k) for k in IN_DISTRIBUTION),
             average("in_distribution", IN_DISTRIBUTION), *(score(k) for k in OUT_OF_DISTRIBUTION),
             average("ood", OUT_OF_DISTRIBUTION)]
    size_cells = ["rows: questions × samples (the authors')", *(sizes(k) for k in IN_DISTRIBUTION), "",
                  *(sizes(k) for k in OUT_OF_DISTRIBUTION), ""]
    lines = ["| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|",
             "| " + " | ".join(cells) + " |", "| " + " | ".join(size_cells) + " |"]
    if backbone:
        for method, values in rows_for(backbone).items():
            lines.append("| " + " | ".join([f"{method}, {backbone} (paper, reported)",
                                            *(_cell(values[k]) for k in KEYS)]) + " |")
    notes = []
    differ = [k for k in (*IN_DISTRIBUTION, *OUT_OF_DISTRIBUTION) if k in rows and rows[k]["comparable"] is False]
    if differ:
        listed = "; ".join(f"{COLUMN_NAMES[k]} {rows[k]['rows']}, the authors' {rows[k]['authors_rows']}"
                           for k in differ)
        notes.append(f"{NOT_COMPARABLE} not comparable with the paper: measured on other rows than the authors' "
                     f"({listed}); an average marked {NOT_COMPARABLE} takes such a column in. The authors' files, "
                     "imported with --processed, are the paper-comparable rows (docs/tools.md).")
    unchecked = [k for k in (*IN_DISTRIBUTION, *OUT_OF_DISTRIBUTION) if k in rows and rows[k]["comparable"] is None]
    if unchecked:
        notes.append(f"{UNCHECKED} rows not checked: the authors' {', '.join(COLUMN_NAMES[k] for k in unchecked)} "
                     "file is not among the files counted here.")
    if not backbone:
        notes.append("No paper rows: the checkpoint's path names none of the paper's backbones "
                     f"({', '.join(BACKBONES)}); pass --backbone (BACKBONE=) to choose one.")
    return "\n".join(lines) + "\n" + "".join(f"\n{note}\n" for note in notes)
