"""Policies by name: `register` adds one, `decide` runs the one a snapshot's settings name.

The budget policy (policy.py) and the baselines (baselines/) register themselves
when imported; importing `scheduler_core` imports them all. A policy is a pure
function ``(snapshot, now) -> Decisions``.
"""

from __future__ import annotations

from collections.abc import Callable

from scheduler_core.snapshot import Decisions, Snapshot

__all__ = ["POLICIES", "Policy", "decide", "register"]

Policy = Callable[[Snapshot, float], Decisions]

POLICIES: dict[str, Policy] = {}
"""Policy name → decide function."""


def register(name: str) -> Callable[[Policy], Policy]:
    """Decorator: make the function the policy called ``name``."""

    def add(policy: Policy) -> Policy:
        POLICIES[name] = policy
        return policy

    return add


def decide(snapshot: Snapshot, now: float) -> Decisions:
    """Run the policy the snapshot's settings name."""
    try:
        policy = POLICIES[snapshot.settings.name]
    except KeyError:
        known = ", ".join(sorted(POLICIES))
        raise ValueError(f"unknown policy {snapshot.settings.name!r} (known: {known})") from None
    return policy(snapshot, now)
