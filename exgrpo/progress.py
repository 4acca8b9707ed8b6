"""Progress bars that suit where they are written: tqdm's bar on a terminal, a few plain lines in a log file.

Written into a file, tqdm redraws with carriage returns as it would on a terminal, so a log holds one redraw per
update (about 425 for the warm start alone) that an editor shows as one long line. In a log we keep tqdm and its
figures (count, rate, time left) but print a line at most every ``LOG_INTERVAL_S`` seconds, each ending in a
newline, plus the last one.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import IO, Any, TypeVar

T = TypeVar("T")

# Seconds between two progress lines in a log file (a terminal's bar redraws as tqdm likes).
LOG_INTERVAL_S = 30.0


class _Lines:
    """A text stream that turns tqdm's carriage-return redraws into one newline-terminated line each."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        line = text.replace("\r", "").rstrip("\n")
        if line.strip():
            self._stream.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self._stream.flush()


def is_terminal(stream: IO[str]) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def progress(
    iterable: Iterable[T], *, desc: str, total: int | None = None, file: IO[str] | None = None, leave: bool = True,
    log_interval_s: float = LOG_INTERVAL_S, **kwargs: Any,
) -> Iterable[T]:
    """``iterable`` with a progress display: a tqdm bar on a terminal; in a file, a line every ``log_interval_s``
    seconds and a last one at the end (``leave`` only matters on a terminal: a log keeps its lines)."""
    from tqdm import tqdm

    stream = sys.stderr if file is None else file
    if is_terminal(stream):
        return tqdm(iterable, desc=desc, total=total, file=stream, leave=leave, dynamic_ncols=True, **kwargs)
    return tqdm(iterable, desc=desc, total=total, file=_Lines(stream), leave=True, ncols=100,
                mininterval=log_interval_s, maxinterval=max(log_interval_s, 10.0), **kwargs)
