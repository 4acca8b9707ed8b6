"""Benchmark evaluation: from a model or a run's checkpoint to the paper's table, under one of two protocols.

``python -m exgrpo.tools.evaluate run --checkpoint CKPT --data FILE... --out_dir DIR`` (what
``run_scripts/eval_benchmarks.sh`` calls) does it all: a verl checkpoint (``global_step_N`` or its ``actor/``) is
merged into a Hugging Face folder with verl's model merger, every benchmark row gets one sample from vLLM (the rows
already hold the avg@k repeats), each response is graded, and ``results.md`` / ``results.json`` give the paper's
table with the paper's reported numbers for the matching backbone beside it. The steps are also commands of their
own: ``generate`` (vLLM: GPU, or vLLM's CPU build), ``score`` (CPU), ``selfcheck`` (the verifier against a
benchmark's own ground truths).

Two protocols (``--protocol``), each difference a row of docs/differences.md:

- ``paper``: what the authors measured. The prompt is the row's chat without its system message, through the
  model's chat template; the graded text is the response after the prompt's opening ``<think>`` up to the second
  ``</think>`` (their ``split("</think>")[1]``, applied only when the prompt ends with ``<think>\\n``; the whole text
  when the response never closes the thought); the grader credits only a ``\\boxed{}`` answer
  (:mod:`exgrpo.verifier.boxed`); a benchmark's score is the mean over its responses.
- ``ours``: the row's whole prompt (system message included, as training sees it); the text after the first
  ``</think>`` (the whole response without one); our grader (math-verify, also unboxed answers; multiple choice by
  option letter); a benchmark's score is avg@k, the mean over questions of each question's mean (a question with
  more samples does not weigh more).

Both generate from token ids built with the chat template the training used (the same ids verl's agent loop
builds: one BOS for Llama, where a text prompt would get a second one from vLLM), with ``max_model_len`` = the
longest prompt + ``max_tokens``, refused in one line before vLLM starts when the model's ``max_position_embeddings``
is smaller. Files in ``--out_dir``: ``generations.jsonl`` (one line per row: qid, prompt, response),
``scores.jsonl`` (one line per response: its graded text, answer, score, error), ``results.md`` and
``results.json`` (each benchmark's rows beside the authors', a column on other rows marked not comparable).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exgrpo import cli, verifier
from exgrpo.cli import InputError
from exgrpo.tools import paper_results, rows
from exgrpo.verifier.workers import DEFAULT_TIMEOUT_S

IN_DISTRIBUTION = paper_results.IN_DISTRIBUTION
OUT_OF_DISTRIBUTION = paper_results.OUT_OF_DISTRIBUTION
THINK_OPEN, THINK_CLOSE = "<think>", verifier.THINK_END_TAG


# ----------------------------------------------------------------------------------------------- protocols
@dataclass(frozen=True)
class Protocol:
    """How a benchmark is measured: the prompt, the graded part of a response, the grader, the average."""

    name: str
    keep_system: bool  # the row's system message goes into the prompt
    grader: str  # exgrpo.verifier.compute_score's grader
    per_question: bool  # True: avg@k (mean over questions of their means); False: mean over responses

    def messages(self, chat: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        turns = [dict(turn) for turn in chat]
        if not self.keep_system and turns and turns[0].get("role") == "system":
            turns = turns[1:]
        return turns

    def graded_section(self, response: str, prompt_text: str | None) -> str:
        """The part of ``response`` that is graded (``prompt_text``: the prompt as the model saw it)."""
        if self.name == "ours":
            return verifier.answer_section(response)
        if prompt_text is None:
            raise ValueError("the paper protocol needs the prompt text (it cuts the response only when the prompt "
                             "ends with '<think>\\n')")
        if not prompt_text.endswith(THINK_OPEN + "\n"):
            return response
        text = THINK_OPEN + "\n" + response
        pieces = text.split(THINK_CLOSE)
        # the authors' split("</think>")[1] fails without a tag, and their boxed grader then reads the whole text
        return pieces[1] if len(pieces) > 1 else text


PROTOCOLS = {"paper": Protocol("paper", keep_system=False, grader="paper", per_question=False),
             "ours": Protocol("ours", keep_system=True, grader="ours", per_question=True)}


def protocol_named(name: str) -> Protocol:
    if name not in PROTOCOLS:
        raise InputError(f"protocol {name!r} is unknown (use {' or '.join(PROTOCOLS)})")
    return PROTOCOLS[name]


# ----------------------------------------------------------------------------------------------- files
def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    if not Path(path).is_file():
        raise FileNotFoundError(f"generations file {path} does not exist (check the path)")
    return rows.read_jsonl(path)


DATA_COLUMNS = ("data_source", "prompt", "reward_model")


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a benchmark parquet, refused with the file named when it is missing, unreadable, empty or foreign.

    Grading takes minutes: every file is read and checked first, so a typo in the last path fails at once, and
    a 0-row file cannot pass a check it never ran.
    """
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file {path} does not exist (check the path)")
    try:
        frame = pd.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow's errors do not name the file
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise InputError(f"data file {path} is not a parquet file ({detail[:200]})") from exc
    if len(frame) == 0:
        raise InputError(f"data file {path} has no rows: nothing to grade (rebuild it with data_preprocess/)")
    missing = [column for column in DATA_COLUMNS if column not in frame.columns]
    if missing:
        raise InputError(f"data file {path} lacks column(s) {missing} (has {sorted(frame.columns)}); give a benchmark "
                         "file written by data_preprocess/math_benchmarks.py or ood_benchmarks.py")
    records = frame.to_dict(orient="records")
    for position, row in enumerate(records):
        model = row["reward_model"]
        truth = model.get("ground_truth") if isinstance(model, Mapping) else None
        if truth is None:
            raise InputError(f"data file {path} row {position}: no reward_model.ground_truth")
        if isinstance(truth, bool) or not isinstance(truth, (str, int, float)):  # str() of it would be graded
            raise InputError(f"data file {path} row {position}: reward_model.ground_truth is a "
                             f"{type(truth).__name__}, not a string or number")
    return records


def row_qid(row: Mapping[str, Any], where: str) -> str:
    extra = row.get("extra_info") or {}
    qid = extra.get("qid") if isinstance(extra, Mapping) else None
    if not qid:
        raise KeyError(f"{where}: extra_info has no 'qid' (build the file with data_preprocess/math_benchmarks.py or "
                       "ood_benchmarks.py; --processed imports the authors' files)")
    return str(qid)


def questions_by_qid(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """qid -> {data_source, ground_truth} from verl rows (repeats of a question share one entry)."""
    table: dict[str, dict[str, str]] = {}
    for position, row in enumerate(records):
        qid = row_qid(row, f"data row {position}")
        entry = {"data_source": str(row["data_source"]), "ground_truth": str(row["reward_model"]["ground_truth"])}
        if table.setdefault(qid, entry) != entry:
            raise ValueError(f"data row {position}: qid {qid} appears with a different data_source/ground truth")
    return table


def select_rows(records: Sequence[Mapping[str, Any]], questions: int | None = None, samples: int | None = None,
                seed: int = 0, benchmarks: Sequence[str] | None = None) -> list[Mapping[str, Any]]:
    """A seeded slice of benchmark rows: ``questions`` per benchmark, each with at most ``samples`` of its repeats,
    of the ``benchmarks`` (data_source names) asked for.

    Questions are drawn per ``data_source``; where the rows carry ``extra_info.level`` (MATH-500 from the hub) the
    draw takes the levels in turn, so a small slice still spans them. Rows keep their file order. None keeps
    everything.
    """
    if benchmarks is not None:
        present = {str(row["data_source"]) for row in records}
        unknown = sorted(set(benchmarks) - present)
        if unknown:
            raise InputError(f"benchmark(s) {unknown} are in none of the data files (they hold {sorted(present)})")
    by_source: dict[str, dict[str, list[int]]] = defaultdict(dict)
    levels: dict[str, Any] = {}
    for position, row in enumerate(records):
        if benchmarks is not None and str(row["data_source"]) not in benchmarks:
            continue
        qid = row_qid(row, f"data row {position}")
        by_source[str(row["data_source"])].setdefault(qid, []).append(position)
        extra = row.get("extra_info")
        levels[qid] = extra.get("level") if isinstance(extra, Mapping) else None
    keep: list[int] = []
    for source, groups in by_source.items():
        qids = list(groups)
        if questions is not None and questions < len(qids):
            rng = random.Random(f"exgrpo-eval-{seed}-{source}")
            strata: dict[Any, list[str]] = defaultdict(list)
            for qid in qids:
                strata[levels[qid]].append(qid)
            for members in strata.values():
                rng.shuffle(members)
            order = [strata[level] for level in sorted(strata, key=str)]
            drawn: list[str] = []
            while len(drawn) < questions:
                for members in order:
                    if members and len(drawn) < questions:
                        drawn.append(members.pop())
            qids = drawn
        for qid in qids:
            keep += groups[qid][:samples] if samples is not None else groups[qid]
    return [records[position] for position in sorted(keep)]


# ----------------------------------------------------------------------------------------------- prompts, models
def render_prompt(tokenizer: Any, chat: Sequence[Mapping[str, Any]], protocol: Protocol,
                  chat_template: str | None = None) -> tuple[str, list[int]]:
    """The prompt as text and as the token ids verl's agent loop builds: the chat template applied and tokenized in
    one call.

    Rendering to text and letting vLLM tokenize it would add the tokenizer's BOS a second time wherever the template
    writes one (Llama 3), a prompt the model never saw in training. The text is what the paper protocol reads the
    end of (and what a person reads in generations.jsonl).
    """
    messages = protocol.messages(chat)
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                         chat_template=chat_template)
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                        chat_template=chat_template, return_dict=False)
    if ids and isinstance(ids[0], list):  # a batch of one
        ids = ids[0]
    return text, [int(i) for i in ids]


def is_hf_model(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (any(folder.glob("*.safetensors")) or any(folder.glob("*.bin")))


def actor_folder(checkpoint: Path) -> Path | None:
    """The FSDP shards' folder of a verl checkpoint (``global_step_N`` or its ``actor/``), or None."""
    for folder in (checkpoint / "actor", checkpoint):
        if any(folder.glob("model_world_size_*_rank_*.pt")):
            return folder
    return None


def checkpoint_label(checkpoint: Path) -> str:
    """A name for a checkpoint's results: ``<experiment>_step<N>`` for verl's ``.../<experiment>/global_step_N``."""
    path = checkpoint.resolve()
    if path.name == "actor":
        path = path.parent
    match = re.fullmatch(r"global_step_(\d+)", path.name)
    return f"{path.parent.name}_step{match.group(1)}" if match else path.name


# the merge's lock and temporary folders (beside ``model``), and its record (in it)
MERGE_LOCK, MERGE_RECORD, MERGE_TEMP_GLOB = "model.lock", "merged_from.json", ".model.merging-*"


def resolve_model(checkpoint: str | Path, work_dir: str | Path) -> Path:
    """A Hugging Face folder for ``checkpoint``: itself, or the merge of a verl checkpoint's FSDP shards.

    The merge goes to ``work_dir/model`` and is reused while the shards it came from are unchanged (their sizes and
    times are recorded beside it): evaluating a checkpoint under both protocols merges it once. Two evaluations of
    one checkpoint started together (a protocol per GPU) share that folder, so the merge runs under a file lock, into
    a temporary folder renamed into place when complete: the second one waits, then finds the merge and reuses it,
    and no evaluation ever sees half-written weights.
    """
    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():
        raise FileNotFoundError(f"checkpoint {checkpoint} is not a directory")
    if is_hf_model(checkpoint):
        return checkpoint
    actor = actor_folder(checkpoint)
    if actor is None:
        raise InputError(f"checkpoint {checkpoint} is neither a Hugging Face model folder (config.json + weights) "
                         "nor a verl checkpoint (global_step_N with actor/model_world_size_*_rank_*.pt)")
    work_dir = Path(work_dir)
    target = work_dir / "model"
    stamp = {"actor": str(actor.resolve()),
             "shards": {p.name: [p.stat().st_size, int(p.stat().st_mtime)]
                        for p in sorted(actor.glob("model_world_size_*_rank_*.pt"))}}
    work_dir.mkdir(parents=True, exist_ok=True)
    with _merge_lock(work_dir / MERGE_LOCK):
        if merged_from(target) == stamp and is_hf_model(target):
            print(f"[eval] merged model of {actor} found: {target}", flush=True)
            return target
        for leftover in work_dir.glob(MERGE_TEMP_GLOB):  # of a merge that was killed: nobody else merges here now
            shutil.rmtree(leftover, ignore_errors=True)
        print(f"[eval] merging {actor} with verl's model merger -> {target}", flush=True)
        start = time.perf_counter()
        temporary = Path(tempfile.mkdtemp(prefix=MERGE_TEMP_GLOB.rstrip("*"), dir=work_dir))
        try:
            run_model_merger(actor, temporary)
            if not is_hf_model(temporary):
                raise RuntimeError(f"verl's model merger wrote no config.json and weights into {temporary}")
            write_atomically(temporary / MERGE_RECORD, json.dumps(stamp, indent=1) + "\n")
            if target.exists():  # an older merge (other shards): out of the way before the rename
                stale = Path(tempfile.mkdtemp(prefix=MERGE_TEMP_GLOB.rstrip("*"), dir=work_dir))
                target.rename(stale / "model")
                shutil.rmtree(stale, ignore_errors=True)
            temporary.rename(target)
        finally:
            shutil.rmtree(temporary, ignore_errors=True)  # nothing left when the rename has happened
    print(f"[eval] merged in {time.perf_counter() - start:.0f} s", flush=True)
    return target


@contextmanager
def _merge_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` while the block runs (one per open file: threads exclude each other too)."""
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"[eval] another evaluation is merging into {path.parent}: waiting for it ({path})", flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def merged_from(target: Path) -> dict[str, Any] | None:
    """The record of what ``target`` was merged from, or None (no merge, or a record nobody could trust)."""
    try:
        record = json.loads((target / MERGE_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def write_atomically(path: Path, text: str) -> None:
    """``path`` holds ``text`` whole or not at all: written beside it, then renamed over it."""
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def run_model_merger(actor: Path, target: Path) -> None:
    """verl's model merger, FSDP shards of ``actor`` -> a Hugging Face folder ``target``."""
    command = [sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", str(actor),
               "--target_dir", str(target)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"verl's model merger failed on {actor} ({' '.join(command)}):\n{tail}")


@dataclass
class EngineSettings:
    """vLLM's settings for one evaluation (the authors': temperature 0.6, top-p 1.0, 8192 new tokens)."""

    temperature: float = 0.6
    top_p: float = 1.0
    max_tokens: int = 8192
    tensor_parallel_size: int = 1
    seed: int = 0
    gpu_memory_utilization: float = 0.85  # on vLLM's CPU build: the share of the memory node it may take
    dtype: str = "auto"
    enforce_eager: bool = False
    chat_template: str | None = None  # a Jinja template instead of the model's own (the run's CHAT_TEMPLATE)


def context_limit(model: str | Path) -> int | None:
    """The positions the model accepts, as vLLM reads them here: ``max_position_embeddings`` of its config.json.

    None where that does not decide it: no such key, a RoPE scaling (``rope_scaling``, or transformers 5's
    ``rope_parameters``, of a type other than ``default``: vLLM scales the limit by it), or
    ``VLLM_ALLOW_LONG_MAX_MODEL_LEN`` set (vLLM then accepts a longer context on purpose).
    """
    path = Path(model) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise InputError(f"{path} is not readable JSON ({exc})") from exc
    if not isinstance(config, Mapping) or os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN"):
        return None
    for key in ("rope_scaling", "rope_parameters"):
        rope = config.get(key)
        if isinstance(rope, Mapping) and rope.get("rope_type", rope.get("type", "default")) != "default":
            return None
    limit = config.get("max_position_embeddings")
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InputError(f"{path}: max_position_embeddings is {limit!r}, not a positive integer")
    return limit


def check_context(model: str | Path, longest_prompt: int, max_tokens: int) -> None:
    """Refuse, in one line saying what to set, a context the model cannot hold, before vLLM is started.

    vLLM is asked for ``max_model_len`` = the longest prompt + ``max_tokens``; past the model's positions it fails
    deep in its start-up. Qwen2.5-Math-7B ships 4,096 positions, fewer than the paper's 8,192 new tokens alone.
    """
    limit = context_limit(model)
    need = longest_prompt + max_tokens
    if limit is None or need <= limit:
        return
    room = limit - longest_prompt
    fix = (f"set MAX_TOKENS={room} (--max_tokens {room}; responses then stop before the paper's 8192 tokens) or "
           if room >= 1 else "")
    raise InputError(f"model {model} accepts {limit} positions (max_position_embeddings in its config.json), fewer "
                     f"than the longest prompt ({longest_prompt} tokens) + max_tokens {max_tokens} = {need}: {fix}"
                     "evaluate the 16k model (its config.json raised to 16384 positions, as the authors' "
                     "Qwen2.5-Math-7B-16k)")


def generate(model: str | Path, records: Sequence[Mapping[str, Any]], output: str | Path, protocol: Protocol,
             settings: EngineSettings | None = None) -> Path:
    """One vLLM sample per row (token-id prompts), written as ``output`` (generations jsonl, one line per row)."""
    settings = settings or EngineSettings()
    try:
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt
    except ImportError as exc:
        raise SystemExit("generation needs vLLM (GPU machine: `pip install -e .[gpu]`; CPU: "
                         f"`bash run_scripts/install_cpu.sh --vllm`); vllm is not importable here ({exc}). Score "
                         "existing generations with `score` instead.") from exc
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    rendered = [render_prompt(tokenizer, row["prompt"], protocol, settings.chat_template) for row in records]
    prompts = [ids for _, ids in rendered]
    longest = max(len(ids) for ids in prompts)
    max_model_len = longest + settings.max_tokens
    check_context(model, longest, settings.max_tokens)
    print(f"[eval] {len(prompts)} prompts ({protocol.name} protocol), longest {longest} tokens; max_model_len "
          f"{max_model_len}", flush=True)
    llm = LLM(model=str(model), tensor_parallel_size=settings.tensor_parallel_size, seed=settings.seed,
              gpu_memory_utilization=settings.gpu_memory_utilization, max_model_len=max_model_len,
              dtype=settings.dtype, enforce_eager=settings.enforce_eager)
    # No per-request seed: identical prompts (the avg@k repeats) would then get identical samples.
    params = SamplingParams(temperature=settings.temperature, top_p=settings.top_p, max_tokens=settings.max_tokens)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompts], params, use_tqdm=True)
    path = Path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for row, (text, ids), result in zip(records, rendered, outputs, strict=True):
            sample = result.outputs[0]
            handle.write(json.dumps({
                "qid": row_qid(row, "data row"), "index": int((row.get("extra_info") or {}).get("index", -1)),
                "data_source": str(row["data_source"]), "ground_truth": str(row["reward_model"]["ground_truth"]),
                "protocol": protocol.name, "prompt": text, "prompt_tokens": len(ids),
                "response": sample.text, "response_tokens": len(sample.token_ids),
                "finish_reason": sample.finish_reason}, ensure_ascii=False) + "\n")
    return path


# ----------------------------------------------------------------------------------------------- scoring
@dataclass(frozen=True)
class Item:
    """One response to grade."""

    qid: str
    data_source: str
    ground_truth: str
    response: str
    prompt: str | None = None  # the prompt text the model saw (the paper protocol reads its end)
    index: int = -1


def resolve(generations: Sequence[Mapping[str, Any]], questions: Mapping[str, Mapping[str, str]]) -> list[Item]:
    """One :class:`Item` per generation line; a line nobody can grade is an error naming it."""
    out = []
    for line_no, record in enumerate(generations, 1):
        qid = record.get("qid", record.get("prompt_id"))
        if qid is None:
            raise KeyError(f"generation {line_no}: no 'qid' (or 'prompt_id') field")
        response = record.get("response")
        if not isinstance(response, str):
            raise KeyError(f"generation {line_no}: 'response' missing or not a string")
        known = questions.get(str(qid), {})
        data_source = record.get("data_source", known.get("data_source"))
        ground_truth = record.get("ground_truth", known.get("ground_truth"))
        if data_source is None or ground_truth is None:
            raise KeyError(f"generation {line_no}: qid {qid!r} is not in --data and the line has no "
                           "data_source/ground_truth")
        prompt = record.get("prompt")
        out.append(Item(str(qid), str(data_source), str(ground_truth), response,
                        prompt if isinstance(prompt, str) else None, int(record.get("index", -1))))
    return out


def score_items(items: Sequence[Item], protocol: Protocol, workers: int = 8, progress: bool = False,
                **reward_kwargs: Any) -> list[dict[str, Any]]:
    """Grade every item under ``protocol`` in parallel threads (the grading runs in the verifier's worker processes);
    order kept. Each result carries the graded text, so a person can see why a response scored what it did."""
    for line_no, item in enumerate(items, 1):
        if protocol.name == "paper" and item.prompt is None:
            raise KeyError(f"generation {line_no} (qid {item.qid}): the paper protocol needs the line's 'prompt' text "
                           "(it cuts the response only when the prompt ends with '<think>\\n'); generations written "
                           "by `generate` have it")

    def one(item: Item) -> dict[str, Any]:
        section = protocol.graded_section(item.response, item.prompt)
        result = verifier.compute_score(item.data_source, section, item.ground_truth, None, think_end_tag=None,
                                        grader=protocol.grader, **reward_kwargs)
        return {"qid": item.qid, "index": item.index, "data_source": item.data_source,
                "ground_truth": item.ground_truth, "protocol": protocol.name, **result, "graded": section}

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        results = pool.map(one, items)
        if progress:
            from exgrpo.progress import progress as progress_display

            results = progress_display(results, total=len(items), desc=f"scoring ({protocol.name})", file=sys.stdout)
        return list(results)


def summarize(scored: Iterable[Mapping[str, Any]], protocol: Protocol | str = "ours") -> dict[str, Any]:
    """Per-benchmark scores under ``protocol``'s average, and the in-distribution / OOD macro averages."""
    protocol = protocol_named(protocol) if isinstance(protocol, str) else protocol
    per_question: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    timeouts: dict[str, int] = defaultdict(int)
    for item in scored:
        per_question[item["data_source"]][item["qid"]].append(float(item["score"]))
        timeouts[item["data_source"]] += int(bool(item.get("timeout", False)))
    benchmarks = {}
    for source in sorted(per_question):
        groups = per_question[source]
        ks = [len(scores) for scores in groups.values()]
        if protocol.per_question:
            mean = sum(sum(scores) / len(scores) for scores in groups.values()) / len(groups)
        else:
            mean = sum(sum(scores) for scores in groups.values()) / sum(ks)
        benchmarks[source] = {"score": 100.0 * mean, "questions": len(groups), "responses": sum(ks),
                              "k_min": min(ks), "k_max": max(ks), "timeouts": timeouts[source]}

    def macro(names: Sequence[str]) -> float | None:
        present = [benchmarks[name]["score"] for name in names if name in benchmarks]
        return sum(present) / len(present) if present else None

    return {"protocol": protocol.name, "aggregation": "avg@k over questions" if protocol.per_question else
            "mean over responses", "benchmarks": benchmarks,
            "in_distribution_avg": macro(IN_DISTRIBUTION), "ood_avg": macro(OUT_OF_DISTRIBUTION),
            "in_distribution_count": sum(name in benchmarks for name in IN_DISTRIBUTION),
            "ood_count": sum(name in benchmarks for name in OUT_OF_DISTRIBUTION), "all_avg": macro(list(benchmarks))}


def markdown_table(summary: Mapping[str, Any]) -> str:
    """The per-benchmark detail: score, k, questions, responses, grading timeouts, the authors' rows (questions ×
    samples) and whether the score is comparable with the paper's (yes, no, ? where the authors' rows are not known
    here, – for a benchmark the paper does not have)."""
    checked = paper_results.comparability(summary["benchmarks"])
    lines = ["| benchmark | score (%) | k | questions | responses | timeouts | the authors' rows | comparable |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    verdict = {True: "yes", False: "no", None: "?"}
    for source, row in summary["benchmarks"].items():
        k = str(row["k_min"]) if row["k_min"] == row["k_max"] else f"{row['k_min']}-{row['k_max']}"
        rows = checked["benchmarks"][source]
        paper_benchmark = source in paper_results.AUTHORS_ROWS  # else one of ours: nothing to compare with
        theirs = rows["authors_rows"] or ("?" if paper_benchmark else "–")
        comparable = verdict[rows["comparable"]] if paper_benchmark else "–"
        lines.append(f"| {source} | {row['score']:.1f} | {k} | {row['questions']} | {row['responses']} | "
                     f"{row['timeouts']} | {theirs} | {comparable} |")
    for key, label in (("in_distribution_avg", "in-distribution avg"), ("ood_avg", "OOD avg"),
                       ("all_avg", "all benchmarks avg")):
        if summary.get(key) is not None:
            comparable = verdict[checked[key]] if key in checked else ""
            lines.append(f"| **{label}** | {summary[key]:.1f} | | | | | | {comparable} |")
    return "\n".join(lines) + "\n"


def results_markdown(summary: Mapping[str, Any], label: str, backbone: str | None) -> str:
    """results.md: the paper's layout for this checkpoint, the paper's reported rows beside it, then the detail."""
    title = f"# {label}: {summary['protocol']} protocol ({summary['aggregation']})\n\n"
    table = paper_results.layout_table(summary, label, backbone)
    return title + table + "\n" + markdown_table(summary)


def write_tables(summary: Mapping[str, Any], out_dir: str | Path, label: str = "this model",
                 backbone: str | None = None) -> tuple[Path, Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md_path, json_path = out_dir / "results.md", out_dir / "results.json"
    md_path.write_text(results_markdown(summary, label, backbone), encoding="utf-8")
    paper_rows = paper_results.rows_for(backbone) if backbone else {}
    document = {"label": label, **summary, "paper_backbone": backbone,
                "paper_reported": {method: dict(values) for method, values in paper_rows.items()},
                "rows_vs_authors": paper_results.comparability(summary["benchmarks"])}
    json_path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return md_path, json_path


def score_files(data: Sequence[str], generations: Sequence[str], out_dir: str, workers: int = 8,
                protocol: Protocol | str = "paper", label: str = "this model", backbone: str | None = None,
                progress: bool = False, **reward_kwargs: Any) -> dict[str, Any]:
    """Grade generation files (against benchmark files for their ground truths) and write the tables."""
    protocol = protocol_named(protocol) if isinstance(protocol, str) else protocol
    questions = questions_by_qid([row for path in data for row in read_rows(path)])
    records = []
    for path in generations:
        found = read_jsonl(path)
        if not found:
            raise InputError(f"generations file {path} has no lines: nothing to score")
        records.extend(found)
    scored = score_items(resolve(records, questions), protocol, workers=workers, progress=progress, **reward_kwargs)
    summary = summarize(scored, protocol)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "scores.jsonl").open("w", encoding="utf-8") as handle:
        for item in scored:
            handle.write(json.dumps(item, ensure_ascii=False) + "\n")
    write_tables(summary, out, label, backbone)
    return summary


# ----------------------------------------------------------------------------------------------- self-check
def perturb_answer(ground_truth: str, data_source: str) -> str:
    """A wrong answer close to the right one: the next option label, or the first integer plus one.

    Used by :func:`self_check`: a verifier that accepts these is too lenient (e.g. it compares a prefix).
    Answers without digits get ``+1`` appended (their value changes for every symbolic answer).
    """
    gold = ground_truth.strip()
    if verifier.is_multiple_choice(data_source):
        if gold.isdigit():
            return str(int(gold) % 4 + 1) if int(gold) <= 4 else str(int(gold) - 1)
        letter = gold.strip("()").upper()
        return "B" if letter == "A" else "A"
    match = re.search(r"\d+", gold)
    if match is None:
        return f"{gold}+1"
    return gold[: match.start()] + str(int(match.group()) + 1) + gold[match.end():]


def boxed_response(answer: str) -> str:
    return f"<think>\nLet me work this out.\n</think>\nThe final answer is \\boxed{{{answer}}}."


def self_check(records: Sequence[Mapping[str, Any]], *, workers: int = 8, **reward_kwargs: Any) -> dict[str, Any]:
    """Grade each row's own ground truth as a final boxed answer (must score 1) and a perturbed one (must be 0).

    Catches ground truths the verifier cannot parse and answer formats it mishandles before they silently
    zero a benchmark. Repeats of a question (same data_source, question and answer) are graded once and
    counted for every row they stand for. Returns counts and one entry per failure with its reason and the
    0-based positions of the rows it stands for.
    """
    unique: dict[tuple[str, str, str], list[int]] = {}
    for position, row in enumerate(records):
        question = row["prompt"][-1]["content"] if not isinstance(row["prompt"], str) else row["prompt"]
        key = (str(row["data_source"]), str(question), str(row["reward_model"]["ground_truth"]))
        unique.setdefault(key, []).append(position)  # position in ``records`` (the authors' index restarts per source)
    keys = list(unique)
    items = []
    for data_source, _question, gold in keys:
        items.append(Item("correct", data_source, gold, boxed_response(gold)))
        items.append(Item("perturbed", data_source, gold, boxed_response(perturb_answer(gold, data_source))))
    graded = score_items(items, PROTOCOLS["ours"], workers=workers, **reward_kwargs)
    failures, failed_rows = [], 0
    for i, (data_source, _question, gold) in enumerate(keys):
        row_failed = False
        for kind, result, want in (("correct", graded[2 * i], 1.0), ("perturbed", graded[2 * i + 1], 0.0)):
            if result["score"] != want:
                row_failed = True
                failures.append({"kind": kind, "data_source": data_source, "ground_truth": gold,
                                 "rows": unique[keys[i]], "pred": result["pred"], "error": result["error"],
                                 "timeout": result["timeout"],
                                 "answer": gold if kind == "correct" else perturb_answer(gold, data_source)})
        failed_rows += len(unique[keys[i]]) if row_failed else 0
    n_rows = sum(len(v) for v in unique.values())
    # No rows checked is no evidence: a pass rate of 0 keeps an empty file from passing any threshold.
    return {"rows": n_rows, "questions": len(keys), "failed_rows": failed_rows,
            "pass_rate": 1.0 - failed_rows / n_rows if n_rows else 0.0, "failures": failures}


# ----------------------------------------------------------------------------------------------- the whole run
def run(checkpoint: str, data: Sequence[str], out_dir: str, protocol: Protocol, settings: EngineSettings,
        questions: int | None = None, samples: int | None = None, subset_seed: int = 0, workers: int = 8,
        label: str | None = None, backbone: str | None = None, benchmarks: Sequence[str] | None = None,
        **reward_kwargs: Any) -> dict[str, Any]:
    """Checkpoint -> merged model -> generations -> scores -> results.md/json in ``out_dir``; returns the summary."""
    start = time.perf_counter()
    records = [row for path in data for row in read_rows(path)]  # every file checked before anything starts
    chosen = select_rows(records, questions, samples, subset_seed, benchmarks)
    label = label or checkpoint_label(Path(checkpoint))
    out = Path(out_dir.replace("{label}", label))
    out.mkdir(parents=True, exist_ok=True)
    print(f"[eval] {len(chosen)} of {len(records)} rows of {len(data)} file(s) -> {out}", flush=True)
    model = resolve_model(checkpoint, out.parent if out.name in PROTOCOLS else out)
    if backbone is None:  # "none": no paper rows
        backbone = paper_results.backbone_of(str(Path(checkpoint).resolve()))
    backbone = None if backbone == "none" else backbone
    gens = generate(model, chosen, out / "generations.jsonl", protocol, settings)
    print(f"[eval] generated {len(chosen)} responses in {time.perf_counter() - start:.0f} s -> {gens}", flush=True)
    summary = score_files(data, [str(gens)], str(out), workers, protocol, label, backbone, progress=True,
                          **reward_kwargs)
    print(f"[eval] done in {time.perf_counter() - start:.0f} s", flush=True)
    return {**summary, "out_dir": str(out)}


def _engine_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = EngineSettings()
    parser.add_argument("--temperature", type=float, default=defaults.temperature)
    parser.add_argument("--top_p", type=float, default=defaults.top_p)
    parser.add_argument("--max_tokens", type=int, default=defaults.max_tokens)
    parser.add_argument("--tensor_parallel_size", type=int, default=defaults.tensor_parallel_size)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--gpu_memory_utilization", type=float, default=defaults.gpu_memory_utilization,
                        help="vLLM's memory share (on its CPU build: of the memory node)")
    parser.add_argument("--dtype", default=defaults.dtype,
                        help="vLLM dtype (on a CPU, eval_benchmarks.sh passes what python -m exgrpo.precision chooses)")
    parser.add_argument("--enforce_eager", action="store_true", help="no CUDA graphs / compilation (CPU profile)")
    parser.add_argument("--chat_template", default=None, help="a Jinja file used instead of the model's own template")
    parser.add_argument("--protocol", default="paper", choices=sorted(PROTOCOLS))
    parser.add_argument("--questions", type=int, default=None, help="questions per benchmark (seeded; default all)")
    parser.add_argument("--samples", type=int, default=None, help="at most this many repeats of a question")
    parser.add_argument("--subset_seed", type=int, default=0)
    parser.add_argument("--benchmarks", nargs="+", default=None, help="only these data_source names (default all)")


def _engine_settings(args: argparse.Namespace) -> EngineSettings:
    for name in ("max_tokens", "tensor_parallel_size"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if not 0.0 < args.gpu_memory_utilization <= 1.0:
        raise InputError(f"--gpu_memory_utilization must lie in (0, 1], got {args.gpu_memory_utilization}")
    for name in ("questions", "samples"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise InputError(f"--{name} must be >= 1, got {getattr(args, name)}")
    template = None
    if args.chat_template:
        path = Path(args.chat_template)
        if not path.is_file():
            raise FileNotFoundError(f"--chat_template {path} does not exist")
        template = path.read_text(encoding="utf-8")
    return EngineSettings(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens,
                          tensor_parallel_size=args.tensor_parallel_size, seed=args.seed,
                          gpu_memory_utilization=args.gpu_memory_utilization, dtype=args.dtype,
                          enforce_eager=args.enforce_eager, chat_template=template)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=cli.DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", required=True)
    whole = sub.add_parser("run", help="checkpoint -> merged model -> generations -> scores -> the paper's table")
    whole.add_argument("--checkpoint", required=True, help="a Hugging Face folder, or verl's global_step_N")
    whole.add_argument("--data", nargs="+", required=True, help="benchmark parquet file(s)")
    whole.add_argument("--out_dir", required=True, help="{label} in it becomes the checkpoint's label")
    whole.add_argument("--label", default=None, help="the name of this model in the table (default from the path)")
    whole.add_argument("--backbone", default=None,
                       help=f"the paper's rows to show beside ours: {', '.join(paper_results.BACKBONES)} or none "
                            "(default: guessed from the checkpoint's path)")
    _engine_arguments(whole)
    gen = sub.add_parser("generate", help="sample one response per row with vLLM")
    gen.add_argument("--model", required=True)
    gen.add_argument("--data", nargs="+", required=True)
    gen.add_argument("--output", required=True)
    _engine_arguments(gen)
    score = sub.add_parser("score", help="grade generations on CPU and write results.md/results.json/scores.jsonl")
    score.add_argument("--data", nargs="*", default=[], help="benchmark parquet(s) to look up qids")
    score.add_argument("--generations", nargs="+", required=True)
    score.add_argument("--out_dir", required=True)
    score.add_argument("--protocol", default="paper", choices=sorted(PROTOCOLS))
    score.add_argument("--label", default="this model")
    score.add_argument("--backbone", default=None)
    for command in (whole, score):
        command.add_argument("--workers", type=int, default=8)
        command.add_argument("--timeout_s", type=float, default=DEFAULT_TIMEOUT_S)
    check = sub.add_parser("selfcheck", help="each row's own boxed ground truth must score 1, a perturbed one 0")
    check.add_argument("--data", nargs="+", required=True)
    check.add_argument("--workers", type=int, default=8)
    check.add_argument("--timeout_s", type=float, default=DEFAULT_TIMEOUT_S)
    check.add_argument("--output", default=None, help="write the full report (json) here")
    args = parser.parse_args(argv)
    if args.command == "selfcheck":
        report = {}
        all_rows = {path: read_rows(path) for path in args.data}
        for path, records in all_rows.items():
            start = time.perf_counter()
            report[path] = self_check(records, workers=args.workers, timeout_s=args.timeout_s)
            result = report[path]
            print(f"{path}: {result['rows']} rows ({result['questions']} distinct), "
                  f"pass {100 * result['pass_rate']:.2f}%, {time.perf_counter() - start:.1f} s")
            for failure in result["failures"]:
                print(f"  FAIL {failure['kind']:9s} {failure['data_source']} rows {failure['rows'][:4]}"
                      f"{'...' if len(failure['rows']) > 4 else ''}: gt={failure['ground_truth']!r} "
                      f"answer={failure['answer']!r} pred={failure['pred']!r} error={failure['error']!r}")
        if args.output:
            Path(args.output).write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        return 0 if all(r["pass_rate"] >= 0.995 for r in report.values()) else 1
    backbone = getattr(args, "backbone", None)
    if backbone is not None and backbone != "none" and backbone not in paper_results.BACKBONES:
        raise InputError(f"--backbone {backbone!r} is unknown (use one of {', '.join(paper_results.BACKBONES)}, "
                         "or none)")
    if args.command == "generate":
        records = select_rows([row for path in args.data for row in read_rows(path)], args.questions, args.samples,
                              args.subset_seed, args.benchmarks)
        path = generate(args.model, records, args.output, protocol_named(args.protocol), _engine_settings(args))
        print(f"generations -> {path}")
        return 0
    if args.command == "run":
        settings = _engine_settings(args)
        summary = run(args.checkpoint, args.data, args.out_dir, protocol_named(args.protocol), settings,
                      args.questions, args.samples, args.subset_seed, args.workers, args.label, backbone,
                      args.benchmarks, timeout_s=args.timeout_s)
        out = Path(summary["out_dir"])
        print((out / "results.md").read_text(encoding="utf-8"))
        print(f"[eval] tables: {out / 'results.md'} {out / 'results.json'}; per response: {out / 'scores.jsonl'}")
        return 0
    summary = score_files(args.data, args.generations, args.out_dir, args.workers, args.protocol, args.label,
                          None if backbone in (None, "none") else backbone, timeout_s=args.timeout_s)
    sys.stdout.write(results_markdown(summary, args.label, None if backbone in (None, "none") else backbone))
    return 0


if __name__ == "__main__":
    raise SystemExit(cli.run(main, prog="exgrpo.tools.evaluate"))
