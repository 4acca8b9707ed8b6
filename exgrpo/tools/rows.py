"""verl's data rows, as the tools read them: the question is the last user turn of the chat-list prompt."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


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
