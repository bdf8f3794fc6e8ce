"""Pure, synchronous core: pairing, verdicts, aggregation, fingerprints and the group state
machine. No module here imports Trio or awaits anything.

The face is the modules other packages build on, named in ``__all__`` (``transition`` holds the
state machine, ``ownership`` who evaluates a group); the modules whose names begin with ``_``
are the core's own.
"""

__all__ = [
    "arrivals",
    "canonical",
    "chat_markup",
    "critical",
    "exact_ints",
    "gym_metrics",
    "identity",
    "invariants",
    "mask_window",
    "messages",
    "outcomes",
    "ownership",
    "pairs",
    "prompt_groups",
    "reachability",
    "records",
    "retention",
    "run_metrics",
    "scoring",
    "server_metrics",
    "standard_json",
    "statistics",
    "tallies",
    "texts",
    "transition",
    "verdicts",
]
