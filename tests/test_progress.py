"""Progress in a log file is a few newline-terminated lines, not one carriage-return redraw per update."""

from __future__ import annotations

import io
import time

from exgrpo.progress import _Lines, is_terminal, progress


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_a_line_per_interval_and_the_last_one_not_a_redraw_per_step():
    log = io.StringIO()
    for _ in progress(range(500), desc="warm start", file=log, leave=False, log_interval_s=3600):
        pass
    text = log.getvalue()
    assert "\r" not in text and text.endswith("\n")
    lines = text.splitlines()
    # the opening line (0/500) and the closing one (500/500): the hour between them never passed
    assert len(lines) == 2 and "0/500" in lines[0] and "500/500" in lines[-1]
    assert all(line.startswith("warm start") for line in lines)


def test_a_log_line_comes_once_the_interval_has_passed():
    log = io.StringIO()
    for i in progress(range(3), desc="steps", file=log, log_interval_s=0.05):
        if i == 1:
            time.sleep(0.2)
    lines = log.getvalue().splitlines()
    assert 3 <= len(lines) <= 4 and "3/3" in lines[-1]


def test_a_terminal_keeps_tqdms_redrawn_bar():
    tty = FakeTerminal()
    assert is_terminal(tty) and not is_terminal(io.StringIO())
    for _ in progress(range(50), desc="steps", file=tty, mininterval=0):
        pass
    assert tty.getvalue().count("\r") >= 50  # redrawn in place, as tqdm does on a terminal


def test_line_stream_drops_blank_redraws_and_terminates_each_line():
    out = io.StringIO()
    stream = _Lines(out)
    for piece in ("\rsteps: 1/3", "\r", "\rsteps: 3/3", "\n"):
        stream.write(piece)
    assert out.getvalue() == "steps: 1/3\nsteps: 3/3\n"
