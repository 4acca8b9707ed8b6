"""One line, not a traceback, when a command is given bad input.

Every command a user types (``python -m exgrpo.embedded.runner``, ``exgrpo.tools.evaluate``, ``exgrpo.inspect_pool``,
``data_preprocess/*.py``) goes through :func:`run`. A wrong path, a file with the wrong columns or a config value out
of range is the user's to fix, and a 20-line traceback buries the one line that says what to fix; a bug is the
developer's, and for it the traceback is the point. So the errors the project raises for bad input (``InputError``,
``ValueError``, ``KeyError``, ``OSError`` such as ``FileNotFoundError``) become ``PROG: error: MESSAGE`` on stderr
and exit status 2 (argparse's status for a usage error), everything else keeps its traceback, and ``--debug`` or
``EXGRPO_DEBUG=1`` brings the traceback back for the expected ones too.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence

EXIT_BAD_INPUT = 2
DEBUG_FLAG = "--debug"
DEBUG_ENV = "EXGRPO_DEBUG"
DEBUG_HELP = (f"Bad input prints one line and exits {EXIT_BAD_INPUT}; {DEBUG_FLAG} anywhere on the command line "
              f"(or {DEBUG_ENV}=1) shows the traceback instead.")


class InputError(ValueError):
    """Input a user can fix (a file, a row, a column, a key); the message names it and says what to do.

    A ValueError, so code that already catches ValueError for bad input keeps working.
    """


EXPECTED_ERRORS: tuple[type[BaseException], ...] = (InputError, ValueError, KeyError, OSError)


def one_line(exc: BaseException) -> str:
    """The exception's message on one line (a KeyError's message without the quotes ``str`` adds)."""
    if isinstance(exc, KeyError) and len(exc.args) == 1 and isinstance(exc.args[0], str):
        text = exc.args[0]
    else:
        text = str(exc)
    text = " ".join(text.split())
    return text or type(exc).__name__


def debug_requested(argv: Sequence[str]) -> bool:
    """Whether this command line or the environment asks for tracebacks."""
    return DEBUG_FLAG in argv or os.environ.get(DEBUG_ENV, "").strip() not in ("", "0")


def run(main: Callable[[list[str]], int | None], argv: Sequence[str] | None = None, *, prog: str) -> int:
    """Call ``main(argv)`` (``--debug`` removed) and turn an expected error into one line and exit status 2.

    ``prog`` starts the line, as argparse starts its own usage errors, so the user sees which command refused.
    Returns main's status (None counts as 0); SystemExit and KeyboardInterrupt pass through unchanged.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    debug = debug_requested(args)
    args = [arg for arg in args if arg != DEBUG_FLAG]
    try:
        status = main(args)
    except EXPECTED_ERRORS as exc:
        if debug:
            raise
        print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0 if status is None else int(status)
