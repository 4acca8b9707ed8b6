"""Shared pieces of the data preprocessors: the authors' system prompt, question ids, verl row layout, I/O.

Every preprocessor emits the same verl row layout, so the trainer, the evaluator and the experience pool can
rely on it::

    {"data_source": str,
     "prompt": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}],
     "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": str},
     "extra_info": {"index": int, "qid": str, "split": str, "repeat": int}}

``extra_info["qid"]`` identifies a question (not a row): it is a hash of data_source and the user message, so
it is the same on every run and machine, and the repeats of a question (avg@k rows) share it.
``extra_info["index"]`` is the row's position in the output file.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import socket
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from exgrpo.cli import InputError
from exgrpo.tools.rows import read_jsonl, user_message  # noqa: F401 - the preprocessors import it from here

# The system prompt of the authors' runs, byte-exact: real newlines after "<think>" and "</think>",
# a literal backslash in "\boxed{}".
SYSTEM_PROMPT = (
    "Your task is to follow a systematic, thorough reasoning process before providing the final solution. "
    "This involves analyzing, summarizing, exploring, reassessing, and refining your thought process through "
    "multiple iterations. Structure your response into two sections: Thought and Solution. In the Thought "
    'section, present your reasoning using the format: "<think>\n {thoughts} </think>\n". Each thought should '
    "include detailed analysis, brainstorming, verification, and refinement of ideas. After \"</think>\n,\" in "
    "the Solution section, provide the final, logical, and accurate answer, clearly derived from the "
    "exploration in the Thought section. If applicable, include the answer in \\boxed{} for closed-form results "
    "like multiple choices or mathematical solutions."
)
SYSTEM_PROMPT_SHA256 = "a8747f1674d341836ab8fae3c29263fee4dd555f07259cdbc6dadf4104ea8926"  # checked in tests

QID_CHARS = 16
LOCAL_SUFFIXES = (".parquet", ".jsonl", ".json", ".csv")
# Names ending like this are files, never hub datasets: read them locally, so a wrong file type is named as such
# instead of being looked up on the hub.
FILE_LIKE_SUFFIXES = (".txt", ".tsv", ".xls", ".xlsx", ".gz", ".bz2", ".xz", ".zip", ".tar", ".arrow", ".pkl",
                      ".pickle", ".npy", ".npz", ".yaml", ".yml", ".md", ".html", ".xml", ".pt")


def question_id(data_source: str, question: str) -> str:
    """Stable id of a question: sha256 over data_source and the exact user message (first 16 hex digits).

    Python's ``hash`` is salted per process, and row positions change when a file is filtered or shuffled, so
    neither can key the experience pool across restarts or machines.
    """
    digest = hashlib.sha256(f"{data_source}\x1f{question}".encode("utf-8", "surrogatepass")).hexdigest()
    return digest[:QID_CHARS]


def chat_prompt(question: str, system_prompt: str = SYSTEM_PROMPT) -> list[dict[str, str]]:
    """The chat the policy sees: the authors' system prompt, then the question as the user turn."""
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": question}]


def make_row(data_source: str, question: str, ground_truth: str, *, split: str, index: int = 0,
             repeat: int = 0, system_prompt: str = SYSTEM_PROMPT) -> dict[str, Any]:
    """One verl row (``extra_info.index`` is renumbered by :func:`finalize`)."""
    return {
        "data_source": data_source,
        "prompt": chat_prompt(question, system_prompt),
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"index": index, "qid": question_id(data_source, question), "split": split,
                       "repeat": repeat},
    }


def finalize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Number the rows (``extra_info.index``) and the repeats of each question (``extra_info.repeat``)."""
    seen: dict[str, int] = {}
    for position, row in enumerate(rows):
        qid = row["extra_info"]["qid"]
        row["extra_info"]["index"] = position
        row["extra_info"]["repeat"] = seen.get(qid, 0)
        seen[qid] = seen.get(qid, 0) + 1
    return rows


def repeat_rows(rows: Sequence[dict[str, Any]], repeats: int) -> list[dict[str, Any]]:
    """Each question ``repeats`` times in a row (avg@k evaluation over k samples of the same prompt)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    out = []
    for row in rows:
        for _ in range(repeats):
            out.append({**row, "extra_info": dict(row["extra_info"]), "reward_model": dict(row["reward_model"])})
    return out


def clean_answer(value: Any) -> str | None:
    """A ground truth as a string, or None when there is no usable answer.

    Hub datasets store answers as str, int, float (AMC: ``27.0``), one-element lists (OlympiadBench's
    ``final_answer``), or placeholders for proof problems; the reward needs one non-empty string.
    """
    if value is None:
        return None
    if hasattr(value, "tolist") and not isinstance(value, str):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        parts = [clean_answer(v) for v in value]
        parts = [p for p in parts if p]
        return ", ".join(parts) if parts else None
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return None
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, int):
        return str(value)
    text = str(value).strip()
    if not text or text.lower() in {"none", "nan", "null", "proof", "notfound", "n/a", "-"}:
        return None
    return text


def first_field(record: Mapping[str, Any], keys: Sequence[str], *, where: str) -> Any:
    """The first present field among ``keys`` (raw schemas differ in capitalisation and naming)."""
    for key in keys:
        if key in record:
            return record[key]
    raise KeyError(f"{where}: none of the fields {list(keys)} present (fields: {sorted(record)})")


# Fields that only multiple-choice schemas have (ARC: choices + answerKey, MMLU-Pro: options, GPQA: the answers
# spelled out), and the question and answer fields of the math schemas: enough to tell a user which preprocessor
# a file belongs to.
MULTIPLE_CHOICE_FIELDS = ("choices", "options", "answerKey", "Correct Answer", "Incorrect Answer 1")
MATH_QUESTION_FIELDS = ("problem", "question", "Problem", "Question")
MATH_ANSWER_FIELDS = ("answer", "Answer", "final_answer")


def is_multiple_choice_record(record: Mapping[str, Any]) -> bool:
    """Whether a raw record is in a multiple-choice schema (ARC, GPQA, MMLU-Pro): it has option fields."""
    return any(key in record for key in MULTIPLE_CHOICE_FIELDS)


def is_math_record(record: Mapping[str, Any]) -> bool:
    """Whether a raw record is in a math-answer schema: a question and a final answer, and no options."""
    return (not is_multiple_choice_record(record) and any(key in record for key in MATH_QUESTION_FIELDS)
            and any(key in record for key in MATH_ANSWER_FIELDS))


def system_message(prompt: Any) -> str | None:
    if hasattr(prompt, "tolist"):
        prompt = prompt.tolist()
    if isinstance(prompt, (list, tuple)):
        for turn in prompt:
            if isinstance(turn, Mapping) and turn.get("role") == "system":
                return turn.get("content")
    return None


def read_local(path: str | Path) -> list[dict[str, Any]]:
    """Records of a local .parquet, .jsonl, .json (list of objects, or {"data": [...]}) or .csv file.

    Whatever the reader says about a broken file (pyarrow, pandas, json, a binary file's decode error), the error
    names the file, and the line for jsonl, because the reader's own message names neither.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in LOCAL_SUFFIXES:
        raise InputError(f"{path}: unsupported file type {suffix or '(no suffix)'!r}; give a "
                         f"{', '.join(LOCAL_SUFFIXES[:-1])} or {LOCAL_SUFFIXES[-1]} file")
    if not path.is_file():
        raise FileNotFoundError(f"no such data file: {path} (check the path)")
    if suffix == ".jsonl":
        return read_jsonl(path)
    try:
        if suffix == ".parquet":
            import pandas as pd

            records = pd.read_parquet(path).to_dict(orient="records")
        elif suffix == ".csv":
            import pandas as pd

            records = pd.read_csv(path, keep_default_na=False).to_dict(orient="records")
        else:
            data = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(data, Mapping):
                data = data.get("data", data.get("rows"))
            if not isinstance(data, list):
                raise InputError(f"{path}: expected a JSON list of objects (or {{'data': [...]}})")
            records = data
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - every reader failure means "this file is not what its name says"
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise InputError(f"{path}: cannot be read as {suffix[1:]} ({detail[:300]})") from exc
    for position, record in enumerate(records):
        if not isinstance(record, Mapping):
            raise InputError(f"{path}: row {position} is a {type(record).__name__}, expected an object with fields")
    return records


class HubUnavailable(RuntimeError):
    """The Hugging Face Hub could not give a dataset (no network, offline mode, gated or unknown name).

    The message is one line that says how to pass a local file instead; the command-line entry points print it
    without a traceback, because a `datasets` traceback does not tell a user on an offline machine what to do.
    """


def _network_error_types() -> tuple[type[BaseException], ...]:
    """Exceptions that mean "the hub cannot be reached", from whichever HTTP stack this `datasets` version uses."""
    found: list[type[BaseException]] = [ConnectionError, TimeoutError, socket.gaierror]
    for module, names in (("httpx", ("TransportError",)), ("requests.exceptions", ("ConnectionError", "Timeout")),
                          ("huggingface_hub.errors", ("OfflineModeIsEnabled", "LocalEntryNotFoundError"))):
        try:
            loaded = importlib.import_module(module)
        except ImportError:
            continue
        found.extend(getattr(loaded, name) for name in names if hasattr(loaded, name))
    return tuple(found)


def _refused_types() -> tuple[type[BaseException], ...]:
    try:
        from datasets.exceptions import DatasetNotFoundError
    except ImportError:
        return ()
    return (DatasetNotFoundError,)


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and all(exc is not other for other in seen):
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def hub_failure_message(source: str, exc: BaseException, local_option: str, *, config: str | None = None,
                        split: str = "train") -> str | None:
    """One line for a hub failure a local file avoids (naming ``local_option``), or None for any other error.

    `datasets` 2-5 report an unreachable hub as ``ConnectionError`` ("Couldn't reach 'X' on the Hub"), offline
    mode as ``OfflineModeIsEnabled`` or ``LocalEntryNotFoundError``, and a raw socket/HTTP error from its HTTP
    library (httpx or requests) when a data file download fails; a gated or unknown dataset as
    ``DatasetNotFoundError``. Any of them anywhere in the exception chain counts.
    """
    chain = _chain(exc)
    network, refused = _network_error_types(), _refused_types()
    cause = next((e for e in chain if isinstance(e, network)), None)
    if cause is not None:
        what = "cannot reach the Hugging Face Hub for"
    else:
        cause = next((e for e in chain if refused and isinstance(e, refused)), None)
        if cause is None:
            return None
        what = "the Hugging Face Hub did not give (gated or unknown name; `hf auth login` for gated ones)"
    detail = " ".join(f"{type(cause).__name__}: {cause}".split())
    part = f"{split} split" if config is None else f"{config} {split} split"
    return (f"{what} dataset {source!r} ({detail}). Use a local copy instead: download it where the Hub is "
            f"reachable (https://huggingface.co/datasets/{source}, e.g. `hf download {source} --repo-type dataset "
            f"--local-dir DIR`) and pass the data file(s) of its {part} (.parquet, .jsonl, .json or .csv) with "
            f"{local_option}.")


def load_records(source: str, *, config: str | None = None, split: str = "train",
                 local_option: str = "a local file path") -> list[dict[str, Any]]:
    """Records from a local file when ``source`` is a path, else from the Hugging Face hub (needs ``datasets``).

    A hub that cannot be reached (or refuses the dataset) raises :class:`HubUnavailable` whose message names
    ``local_option``, the command-line option that takes a local file instead.
    """
    if Path(source).suffix.lower() in LOCAL_SUFFIXES + FILE_LIKE_SUFFIXES or Path(source).exists():
        return read_local(source)
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - datasets is a listed dependency
        raise HubUnavailable(f"loading {source!r} from the Hugging Face Hub needs `pip install datasets`; or pass "
                             f"a local file with {local_option}") from exc
    try:
        dataset = datasets.load_dataset(source, config, split=split)
    except Exception as exc:
        message = hub_failure_message(source, exc, local_option, config=config, split=split)
        if message is None:
            raise
        raise HubUnavailable(message) from exc
    return [dict(record) for record in dataset]


def write_rows(rows: Sequence[dict[str, Any]], output: str | Path) -> Path:
    """Write verl rows as parquet (or jsonl when ``output`` ends in .jsonl); zero rows is an error.

    A 0-row file (pandas writes it with no columns at all) would only fail later, inside a trainer or evaluator
    that cannot say where it came from, so nothing is written and the caller's message says why it is empty.
    """
    output = Path(output)
    if output.suffix.lower() not in (".parquet", ".jsonl"):
        raise InputError(f"--output {output} must end in .parquet or .jsonl")
    if not rows:
        raise InputError(f"no rows to write to {output}; nothing written")
    output.parent.mkdir(parents=True, exist_ok=True)
    if output.suffix.lower() == ".jsonl":
        with output.open("w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        return output
    import pandas as pd

    pd.DataFrame(list(rows)).to_parquet(output, index=False)
    return output


def dedupe(rows: Iterable[dict[str, Any]]) -> tuple[list[dict[str, Any]], int, int]:
    """Keep the first row of every qid; returns (rows, duplicates dropped, duplicates whose answer differed)."""
    kept: dict[str, dict[str, Any]] = {}
    dropped = conflicting = 0
    for row in rows:
        qid = row["extra_info"]["qid"]
        if qid in kept:
            dropped += 1
            if kept[qid]["reward_model"]["ground_truth"] != row["reward_model"]["ground_truth"]:
                conflicting += 1
            continue
        kept[qid] = row
    return list(kept.values()), dropped, conflicting


def rows_from_processed(records: Iterable[Mapping[str, Any]], *, source_name: str = "processed",
                        split: str = "test", replace_system_prompt: bool = True
                        ) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Re-emit rows of an already processed verl file (the authors' ``*.parquet``) in our layout.

    Their rows already carry ``data_source``, a chat ``prompt`` (system + user), and
    ``reward_model.ground_truth``; their ``extra_info`` has only ``index``/``split`` (index 0-based per file),
    so the qid is recomputed from data_source + user turn. Repeated questions (AIME x32) stay separate rows
    sharing one qid. Returns the rows and counts (rows, other_system_prompt) for the summary.
    """
    rows, other_system = [], 0
    records = list(records)
    if not records:
        raise InputError(f"{source_name}: no rows; give the authors' processed parquet (e.g. math_test.parquet)")
    for position, record in enumerate(records):
        where = f"{source_name} row {position}"
        for field in ("data_source", "prompt", "reward_model"):
            if field not in record:
                raise KeyError(f"{where}: missing field {field!r} (fields: {sorted(record)}); --processed takes a "
                               "verl file with data_source, prompt and reward_model (the authors' processed parquet)")
        reward_model = record["reward_model"]
        if not isinstance(reward_model, Mapping) or "ground_truth" not in reward_model:
            raise KeyError(f"{where}: reward_model has no 'ground_truth'")
        answer = clean_answer(reward_model["ground_truth"])
        if answer is None:
            raise ValueError(f"{where}: empty ground truth {reward_model['ground_truth']!r}")
        system = system_message(record["prompt"])
        if system != SYSTEM_PROMPT:
            other_system += 1
        extra = record.get("extra_info") or {}
        system_prompt = SYSTEM_PROMPT if replace_system_prompt or system is None else system
        rows.append(make_row(str(record["data_source"]), user_message(record["prompt"], where=where), answer,
                             split=str(extra.get("split", split)) if isinstance(extra, Mapping) else split,
                             system_prompt=system_prompt))
    return finalize(rows), {"rows": len(rows), "other_system_prompt": other_system}


def summary_line(name: str, counts: Mapping[str, int]) -> str:
    return f"{name}: " + ", ".join(f"{key}={value}" for key, value in counts.items())
