"""Roost: a trio runtime for LLM agents.

Threads, turns, worker trees, schedules and client connections are actors with bounded mailboxes
under supervisors; every stop is a structured cancellation. See ``DESIGN.md`` of the project for the
map. The public names of each room are re-exported by that room's ``__init__``.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
