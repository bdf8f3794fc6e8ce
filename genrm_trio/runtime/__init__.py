"""The Trio runtime: the engine that runs every group's transitions through its store, waiters,
evaluations, batches of arrivals, /compare, and shutdown.

The face is ``engine`` (``Engine``), ``hooks`` (the fault-injection points of I-20) and
``compare``; the modules whose names begin with ``_`` are the engine's own parts.
"""

__all__ = ["compare", "engine", "hooks"]
