"""verl's data rows, as the tools and the preprocessors read them: JSON lines, and the question as the last user turn
of the chat-list prompt."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from exgrpo.cli import InputError


def user_message(prompt: Any, *, where: str) -> str:
    """The last user turn of a chat-list prompt (verl rows), or the prompt itself when it is a plain string."""
    if isinstance(prompt, str):
        return prompt
    if hasattr(prompt, "tolist"):
        prompt = prompt.tolist()
    if isinstance(prompt, (list, tuple)):
        users = [turn.get("content") for turn in prompt if isinstance(turn, Mapping) and turn.get("role") == "user"]
        if users and isinstance(users[-1], str):
            return users[-1]
    raise ValueError(f"{where}: 'prompt' has no user turn (got {type(prompt).__name__})")


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Every object of a JSON-lines file; a bad line or encoding is an :class:`InputError` naming the file and line."""
    path = Path(path)
    records = []
    try:
        with path.open(encoding="utf-8") as handle:
            for line_no, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise InputError(f"{path}:{line_no}: invalid JSON ({exc}); fix or remove that line") from exc
                if not isinstance(record, Mapping):
                    raise InputError(f"{path}:{line_no}: a JSON {type(record).__name__}, expected an object "
                                     "with fields")
                records.append(record)
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); is it really jsonl?") from exc
    return records
