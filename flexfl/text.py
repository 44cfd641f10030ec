"""Words in messages that depend on a number."""

from __future__ import annotations


def count(n: int, noun: str) -> str:
    """'1 agent', '5 agents' (English nouns that take an s)."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
