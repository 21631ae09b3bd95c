"""Where the real-world corpus is: one place, documented in the README ("The two commands").

The corpus (public samples nobody on this project wrote: webhooks, access logs, RCA datasets)
is not in the repository. It is expected at ``../shared/corpus`` beside the repository, or
wherever ``PROMREFLEX_CORPUS`` points. Tests that need it use the ``corpus_dir`` fixture
(tests/conftest.py), directly or through ``needs_corpus``: when it is missing the test is
skipped on a workstation and FAILS under ``CI=true``, never skipped silently there.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ENV = "PROMREFLEX_CORPUS"


def corpus_root() -> Path:
    env = os.environ.get(ENV)
    return Path(env).expanduser() if env else REPO.parent / "shared" / "corpus"


def corpus(name: str) -> Path:
    """The corpus folder ``name`` (a path; whether it exists is the fixture's business)."""
    return corpus_root() / name


def require_corpus() -> Path:
    """The corpus root, or skip (fail under CI=true) when it is not there."""
    root = corpus_root()
    if not root.is_dir():
        msg = f"the real-world corpus is not at {root} (put it at ../shared/corpus or set {ENV})"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return root


needs_corpus = pytest.mark.usefixtures("corpus_dir")
