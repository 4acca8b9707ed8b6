"""Shared test helpers: where the project's read-only benchmark data lives, and whether verl is importable."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_BENCHMARKS = REPO.parent / "shared" / "data" / "benchmarks"


@pytest.fixture
def shared_benchmarks() -> Path:
    if not SHARED_BENCHMARKS.is_dir():
        pytest.skip(f"{SHARED_BENCHMARKS} is absent (only present beside the project's checkout)")
    return SHARED_BENCHMARKS
