"""The shared command-line error handling: bad input is one line and exit status 2, bugs keep their traceback."""

from __future__ import annotations

import pytest

from exgrpo import cli
from exgrpo.cli import InputError


def _raising(exc: BaseException):
    def main(argv: list[str]) -> int:
        raise exc

    return main


@pytest.mark.parametrize(("exc", "line"), [
    (InputError("data.jsonl row 3: no answer"), "tool: error: data.jsonl row 3: no answer\n"),
    (ValueError("trainer.steps must be >= 1,\n  got 0"), "tool: error: trainer.steps must be >= 1, got 0\n"),
    (KeyError("row 0: missing field 'prompt'"), "tool: error: row 0: missing field 'prompt'\n"),
    (FileNotFoundError("data file x.parquet does not exist"), "tool: error: data file x.parquet does not exist\n"),
    (IsADirectoryError(21, "Is a directory", "out"), "tool: error: [Errno 21] Is a directory: 'out'\n"),
])
def test_expected_errors_become_one_line_on_stderr_and_exit_status_2(exc, line, capsys, monkeypatch):
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    assert cli.run(_raising(exc), [], prog="tool") == 2
    captured = capsys.readouterr()
    assert captured.err == line and captured.out == ""


def test_an_error_without_a_message_is_named_by_its_type(capsys, monkeypatch):
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    assert cli.run(_raising(ValueError()), [], prog="tool") == 2
    assert capsys.readouterr().err == "tool: error: ValueError\n"


def test_other_errors_keep_their_traceback(monkeypatch):
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    with pytest.raises(TypeError, match="a bug"):
        cli.run(_raising(TypeError("a bug")), [], prog="tool")
    with pytest.raises(SystemExit):
        cli.run(_raising(SystemExit(3)), [], prog="tool")


def test_debug_flag_or_environment_brings_the_traceback_back_and_the_flag_is_not_passed_on(monkeypatch):
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    seen = []

    def main(argv: list[str]) -> int:
        seen.append(argv)
        raise ValueError("bad value")

    with pytest.raises(ValueError, match="bad value"):
        cli.run(main, ["--x", "--debug", "a=1"], prog="tool")
    assert seen == [["--x", "a=1"]]
    monkeypatch.setenv(cli.DEBUG_ENV, "1")
    with pytest.raises(ValueError, match="bad value"):
        cli.run(main, [], prog="tool")
    monkeypatch.setenv(cli.DEBUG_ENV, "0")
    assert cli.run(main, [], prog="tool") == 2


def test_status_of_main_is_returned_and_none_counts_as_success():
    assert cli.run(lambda argv: None, [], prog="tool") == 0
    assert cli.run(lambda argv: 1, [], prog="tool") == 1


def test_input_error_is_a_value_error_so_existing_handlers_still_catch_it():
    assert issubclass(InputError, ValueError)
