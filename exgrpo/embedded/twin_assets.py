"""The task and model that the CPU twins of the run scripts train with the real verl recipe on a CPU.

verl loads a model folder and parquet files by path; on a machine without hub access both are built here, once,
and reused: the synthetic arithmetic task in verl's parquet layout (``exgrpo/embedded/task.py``) with a
level-balanced validation split (31 questions per level), and a tiny Qwen2 that vLLM's CPU backend can serve (head
size 32, a byte-level vocabulary with the chat formats' control tokens) warm-started on the prompts of the chat
template the script uses, answering in the thought-then-answer form (``23+58=81</think>\\boxed{81}``), until about
half of its greedy answers are right.
At temperature 1 its rollouts are then mixed (0 < k < K correct in many groups), also under the authors' strict
grading, and their accuracy crosses the delayed-start threshold within the first steps, so replay starts through
the real rule.

Every question is written at one width (left-filled with spaces, ``"Q: 3+4="`` beside ``"Q:23+58="``), so every
prompt a template renders has the same number of tokens: verl and vLLM then pass them unpadded, exactly as the warm
start saw them.

``python -m exgrpo.embedded.twin_assets --root cache/verl_cpu [--chat-template FILE]`` prints shell assignments for the
launcher (``MODEL_PATH=...``, ``TRAIN_FILE=...``, ``VAL_FILE=...``, ``MAX_PROMPT_LENGTH=...``,
``MAX_RESPONSE_LENGTH=...``); progress goes to stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import shlex
import sys
from collections.abc import Sequence
from importlib import metadata, util
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

# The training split is build_splits(1500, 16, seed): its training prompts name the cached warm-started model
# (tiny_model.cache_key hashes them), so the 16 held-out questions per level of levels 2 and 3 stay what they were.
# Validation is level-balanced: level 1 has only 31 held-out questions, so levels 2 and 3 get 31 too, the 16 plus
# 15 more drawn disjoint from every training and held-out question. 93 questions: an accuracy at p = 0.5 has a
# binomial standard deviation of 0.052 over the draw of questions (greedy decoding adds no sampling noise), where
# the former 63 questions, 31 of them the easiest level, weighed level 1 at half of the mean.
N_TRAIN_PER_LEVEL = 1500
N_VAL_PER_LEVEL = 16
N_VAL_BALANCED = 31
VAL_FILE_NAME = "val_balanced.parquet"  # a new name: caches holding the former val.parquet build this one beside it
WARM_START_TARGET_ACC = 0.6
QUESTION_WIDTH = 8  # "Q:23+58=", the longest question
# Positions the twin's model accepts: enough for the real benchmarks' prompts in bytes (the longest of the authors'
# files renders to ~5.2k) plus a short answer, so the evaluation command can run a twin's checkpoint on them.
CONTEXT_LENGTH = 8192
# What earlier commands printed, each under a fingerprint of what it depends on: a launch that finds everything built
# prints it again without importing torch and transformers (~7 s of every launch otherwise).
MEMO_NAME = "assets_memo.json"
_MEMO_SOURCES = ("exgrpo.embedded.twin_assets", "exgrpo.embedded.tiny_model", "exgrpo.embedded.task",
                 "exgrpo.embedded.chat_templates")
_MEMO_LIBRARIES = ("transformers", "tokenizers", "jinja2", "torch", "pandas")


def fixed_width(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows with each user message left-filled with spaces to QUESTION_WIDTH characters."""
    frame = frame.copy()
    frame["prompt"] = [[{**m, "content": m["content"].rjust(QUESTION_WIDTH)} for m in chat] for chat in frame["prompt"]]
    return frame


_QUESTION_RE = re.compile(r"Q:(\d+)([+-])(\d+)=")


def operands(frame: pd.DataFrame) -> set[tuple[int, str, int]]:
    """The (a, op, b) of every question in ``frame``: what a new draw must avoid."""
    found = set()
    for chat in frame["prompt"]:
        match = _QUESTION_RE.fullmatch(chat[-1]["content"].strip())
        if match is None:
            raise ValueError(f"not a synthetic arithmetic question: {chat[-1]['content']!r}")
        found.add((int(match[1]), match[2], int(match[3])))
    return found


def balanced_validation(train: pd.DataFrame, held_out: pd.DataFrame, seed: int,
                        per_level: int = N_VAL_BALANCED) -> pd.DataFrame:
    """``held_out`` topped up to ``per_level`` questions in every level, none of them a training question.

    Extra questions come from their own seeded stream, so the training split (and with it the model's cache key) is
    the one ``build_splits`` gives; a level that already holds ``per_level`` keeps its first ``per_level``.
    """
    import pandas as pd

    from exgrpo.embedded.task import make_row, sample_pairs

    taken = operands(train) | operands(held_out)
    rng = random.Random(f"exgrpo-balanced-validation-{seed}")
    rows = []
    for level in sorted({int(e["level"]) for e in held_out["extra_info"]}):
        have = held_out[[int(e["level"]) == level for e in held_out["extra_info"]]]
        rows += have.head(per_level).to_dict("records")
        rows += [make_row(*pair, level, "test", len(rows) + i)
                 for i, pair in enumerate(sample_pairs(level, max(0, per_level - len(have)), rng, taken))]
    return pd.DataFrame(rows)


def render_prompts(tokenizer, chats: Sequence, chat_template: str | None) -> list[str]:
    """The prompt texts verl hands the model: each chat through ``chat_template`` (None: the model's own)."""
    return [tokenizer.apply_chat_template(list(chat), chat_template=chat_template, tokenize=False,
                                          add_generation_prompt=True) for chat in chats]


def prompt_width(tokenizer, prompts: Sequence[str]) -> int:
    """The one token length of all ``prompts``; prompts of different lengths would need padding the model never saw."""
    lengths = {len(tokenizer.encode(p, add_special_tokens=False)) for p in prompts}
    if len(lengths) != 1:
        raise ValueError(f"rendered prompts have {len(lengths)} different token lengths ({sorted(lengths)[:5]}...): "
                         "the chat template must not depend on anything but the fixed-width question")
    return lengths.pop()


def build(root: str | Path, seed: int = 0, warm_start_target_acc: float = WARM_START_TARGET_ACC,
          chat_template: str | None = None, data_only: bool = False, progress: bool = True) -> dict[str, object]:
    """Write (or reuse) ``root/task/train.parquet``, the level-balanced ``root/task/val_balanced.parquet`` and the
    model warm-started on ``chat_template``'s prompts.

    One model per rendered prompt form: a template that renders the model's own prompts (qwen_think.jinja) reuses
    its warm start. ``data_only`` skips the model (a run that brings its own).
    """
    import pandas as pd

    from exgrpo.embedded import tiny_model as tm
    from exgrpo.embedded.task import build_splits

    root = Path(root)
    data = root / "task"
    train_file, val_file = data / "train.parquet", data / VAL_FILE_NAME
    if not (train_file.exists() and val_file.exists()):
        data.mkdir(parents=True, exist_ok=True)
        train, held_out = build_splits(N_TRAIN_PER_LEVEL, N_VAL_PER_LEVEL, seed)
        files = [(balanced_validation(train, held_out, seed), val_file)]
        if not train_file.exists():  # an existing training file is left alone: runs may be reading it
            files.append((train, train_file))
        for frame, path in files:
            fixed_width(frame).to_parquet(path.with_suffix(".tmp"), index=False)
            path.with_suffix(".tmp").replace(path)
    out: dict[str, object] = {"TRAIN_FILE": train_file.resolve(), "VAL_FILE": val_file.resolve()}
    if data_only:
        return out
    tokenizer = tm.build_tokenizer(vllm_compatible=True)
    frame = pd.read_parquet(train_file)
    prompts = render_prompts(tokenizer, frame["prompt"], chat_template)
    answers = [str(rm["ground_truth"]) for rm in frame["reward_model"]]
    cfg = tm.TinyModelConfig(vllm_compatible=True, thought_then_answer=True,
                             prompt_width=prompt_width(tokenizer, prompts), context_length=CONTEXT_LENGTH,
                             warm_start_target_acc=warm_start_target_acc, seed=seed)
    _, _, model_path = tm.load_or_build(root / "models", prompts, answers, cfg, progress=progress)
    return {"MODEL_PATH": model_path.resolve(), **out, "MAX_PROMPT_LENGTH": cfg.prompt_width,
            "MAX_RESPONSE_LENGTH": cfg.max_response_tokens}


def request_fingerprint(request: dict[str, object]) -> str:
    """The request (root, seed, target, template text, data only), the source of the code that builds the assets
    and the versions of the libraries that render and tokenize the prompts the model's cache key hashes."""
    digest = hashlib.sha256(json.dumps(request, sort_keys=True, default=str).encode())
    for module in _MEMO_SOURCES:
        digest.update(Path(util.find_spec(module).origin).read_bytes())
    for library in _MEMO_LIBRARIES:
        try:
            digest.update(f"{library}=={metadata.version(library)}".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{library} absent".encode())
    return digest.hexdigest()


def _file_stamps(values: dict[str, object]) -> dict[str, list[int]]:
    """Size and modification time of every file the assignments name (the model by its completion record)."""
    files = {name: Path(str(value)) for name, value in values.items() if name.endswith("_FILE")}
    if "MODEL_PATH" in values:
        files["MODEL_PATH"] = Path(str(values["MODEL_PATH"])) / "warm_start.json"
    stamps = {}
    for name, path in files.items():
        stat = path.stat()
        stamps[name] = [stat.st_size, stat.st_mtime_ns]
    return stamps


def _read_memo(root: Path) -> dict:
    try:
        memo = json.loads((root / MEMO_NAME).read_text())
    except (OSError, ValueError):
        return {}
    return memo if isinstance(memo, dict) else {}


def remembered(root: Path, fingerprint: str) -> dict[str, object] | None:
    """The assignments of an earlier identical request, if every file they name is still the one it was."""
    try:
        entry = _read_memo(root)[fingerprint]
        return entry["values"] if _file_stamps(entry["values"]) == entry["stamps"] else None
    except (OSError, KeyError, TypeError):
        return None


def remember(root: Path, fingerprint: str, values: dict[str, object]) -> None:
    """Add this request's assignments to the memo (one entry per request: the scripts' templates differ)."""
    values = {name: str(value) if isinstance(value, Path) else value for name, value in values.items()}
    memo = {key: entry for key, entry in _read_memo(root).items() if key != fingerprint}
    memo = dict(list(memo.items())[-15:]) | {fingerprint: {"values": values, "stamps": _file_stamps(values)}}
    temporary = root / f"{MEMO_NAME}.{random.getrandbits(32):08x}.tmp"
    temporary.write_text(json.dumps(memo, indent=1))
    temporary.replace(root / MEMO_NAME)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="cache/verl_cpu", help="folder for the data and the model cache")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warm-start-target-acc", type=float, default=WARM_START_TARGET_ACC)
    parser.add_argument("--chat-template", default=None,
                        help="Jinja file the run passes as custom_chat_template (default: the model's own, ChatML)")
    parser.add_argument("--data-only", action="store_true", help="only the task files (the run brings a model)")
    args = parser.parse_args(argv)
    template = Path(args.chat_template).read_text() if args.chat_template else None
    root = Path(args.root)
    fingerprint = request_fingerprint({"root": root.resolve(), "seed": args.seed, "data_only": args.data_only,
                                       "target": args.warm_start_target_acc, "template": template})
    values = remembered(root, fingerprint)
    if values is None:
        stdout = sys.stdout
        sys.stdout = sys.stderr  # progress bars and library output must not end up in the assignments
        try:
            print(f"[twin_assets] synthetic task and tiny model under {args.root} (built once, ~4 min)")
            values = build(root, args.seed, args.warm_start_target_acc, template, args.data_only)
        finally:
            sys.stdout = stdout
        remember(root, fingerprint, values)
    for name, value in values.items():
        print(f"{name}={shlex.quote(str(value))}")


if __name__ == "__main__":
    main()
