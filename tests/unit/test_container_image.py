"""The controller's container image (compose/promreflex/Dockerfile) installs from uv.lock.

No Docker engine runs here: these check what can be checked without one. The uv commands
themselves were run in a scratch directory with the same files (see the Dockerfile).
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "compose" / "promreflex" / "Dockerfile"
IGNORE = DOCKERFILE.with_name("Dockerfile.dockerignore")


def copied_sources() -> list[str]:
    return [src for line in DOCKERFILE.read_text().splitlines() if line.startswith("COPY ") for src in line.split()[1:-1]]


def sent_to_the_build(path: str) -> bool:
    """BuildKit's rule for these patterns: the last matching line decides."""
    sent = True
    for raw in IGNORE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = line.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, pattern):
            sent = negated
    return sent


def test_every_copied_file_exists_and_is_in_the_build_context():
    sources = copied_sources()
    assert "uv.lock" in sources and "pyproject.toml" in sources
    for src in sources:
        assert (REPO / src).exists(), src
        assert sent_to_the_build(src), f"{src} is excluded by {IGNORE.name}"


def test_the_environment_comes_from_the_lock_without_dev_dependencies():
    text = DOCKERFILE.read_text()
    syncs = re.findall(r"uv sync ([^\n&]+)", text)
    assert syncs and all("--locked" in s and "--no-dev" in s for s in syncs), syncs
    assert "pip install ." not in text


def test_uv_is_pinned_to_the_version_scripts_uv_installs():
    image = re.search(r"^ARG UV_VERSION=(\S+)$", DOCKERFILE.read_text(), re.M)
    script = re.search(r"^UV_VERSION=(\S+)$", (REPO / "scripts" / "uv").read_text(), re.M)
    assert image and script and image[1] == script[1]
    assert 'pip install "uv==${UV_VERSION}"' in DOCKERFILE.read_text()
