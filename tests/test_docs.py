"""No file of the project points outside the repository.

A user has the repository and nothing beside it, so a path into a sibling folder (the design notes
and references the project was started from) is a dead end for them. This reads every file git
tracks, and those it would add (untracked, not ignored), and fails naming each line that does.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Built from parts so that this file does not match itself.
SIBLING = "shared"
FORBIDDEN = (f"../{SIBLING}", f"{SIBLING}/design", f"{SIBLING}/reference")


def project_files() -> list[Path]:
    """Tracked files plus untracked ones git does not ignore, relative to the repository root."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, check=True, capture_output=True,
    ).stdout
    names = sorted({name for name in listed.decode().split("\0") if name})
    return [ROOT / name for name in names if (ROOT / name).is_file()]


def test_the_check_finds_a_reference() -> None:
    assert any(pattern in f"see ../{SIBLING}/design/STYLE.md" for pattern in FORBIDDEN)
    assert any(pattern in f"`{SIBLING}/reference/x.md`" for pattern in FORBIDDEN)


def test_no_file_refers_outside_the_repository() -> None:
    files = project_files()
    assert any(path.name == "README.md" for path in files), "git listed none of the project's files"
    found = []
    for path in files:
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:  # images and other binaries
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if any(pattern in line for pattern in FORBIDDEN):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not found, "files that point outside the repository:\n" + "\n".join(found)
