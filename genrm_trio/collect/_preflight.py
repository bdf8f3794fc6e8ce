"""What collect checks in the server's `/healthz` before it sends anything: that the server judges
groups of exactly `--repeats` rollouts. A mismatch would otherwise wait for slots that never
come until the collection deadline, or be refused slot by slot."""

from __future__ import annotations

from typing import Final

GROUP_SIZE_FIELD: Final = "num_rollouts_per_prompt"


def group_size_refusal(health: object, repeats: int, url: str) -> str | None:
    """Why a run of groups of ``repeats`` cannot go to the server whose `/healthz` body is
    ``health`` (decoded JSON), or None when it can, or when the server does not report its group
    size (an older server: nothing to check against)."""
    if not isinstance(health, dict) or GROUP_SIZE_FIELD not in health:
        return None
    size = health[GROUP_SIZE_FIELD]
    if size is None:
        return (
            f"the server at {url} does not judge groups ({GROUP_SIZE_FIELD}: null): it would"
            f" answer every rollout with its default score; serve with {GROUP_SIZE_FIELD}:"
            f" {repeats}"
        )
    if size != repeats:
        return (
            f"--repeats {repeats} does not match the server's group size ({GROUP_SIZE_FIELD}:"
            f" {size} at {url}); pass --repeats {size}, or serve with {GROUP_SIZE_FIELD}:"
            f" {repeats}"
        )
    return None
