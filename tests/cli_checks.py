"""Shared checks for CLI tests: a bad input is one line on stderr, exit code 2, nothing on disk touched."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli import main

PRECIOUS = "precious\n"


def assert_fails(capsys: pytest.CaptureFixture[str], argv: list, message: str, existing: Path | None = None) -> None:
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:  # argparse refusing an argument exits through _Parser.error
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert len(err) <= 301, err  # the one line is at most MAX_MESSAGE_CHARS
    assert message in err, err
    if existing is not None:
        assert existing.read_text() == PRECIOUS
