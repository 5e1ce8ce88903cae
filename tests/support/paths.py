"""The repository's root, for tests that read its files (docs, deploy/, bench/)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["REPO_ROOT"]

REPO_ROOT = Path(__file__).resolve().parents[2]
