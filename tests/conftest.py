from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"


@pytest.fixture
def published_csv() -> Path:
    """The measured published runs; shipped in the repository as tests/data/published_runs.csv."""
    return ROOT / "tests" / "data" / "published_runs.csv"
