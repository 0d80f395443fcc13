"""Errors every part of the pipeline package may raise: the user's mistakes, found before a run."""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(ValueError):
    """A mistake in what the user asked for (exit status 2): a missing input, a bad flag."""
