"""Small registered rules: every judgement a gate makes is one function whose docstring states the
hypothesis it tests. `rule(gate)` registers a function under its gate in `REGISTRY` (for the docs
and the tests that keep every rule documented) and returns it unchanged, so a gate still calls its
rules in the order it lists them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["REGISTRY", "Rule", "rule"]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Rule:
    gate: str  # e.g. "dynamics.hard"
    name: str
    hypothesis: str  # the first paragraph of the function's docstring


REGISTRY: dict[str, Rule] = {}


def rule(gate: str) -> Callable[[F], F]:
    """Register the decorated function as a rule of `gate`; its docstring is the hypothesis."""

    def register(function: F) -> F:
        doc = (function.__doc__ or "").strip()
        if not doc:
            raise ValueError(f"rule {gate}.{function.__name__} states no hypothesis")
        name = function.__name__.lstrip("_")
        REGISTRY[f"{gate}.{name}"] = Rule(gate, name, doc.split("\n\n", 1)[0])
        return function

    return register
