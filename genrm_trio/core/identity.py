"""Which response a member holds: exact bytes first, the canonical fingerprint only when needed.

Two responses are the same exactly when their canonical forms are equal (C-20, C-21). C-24 lets
the server decide that by any method that gives the same classes; this one is cheap for the
common cases. A new member keeps a view of its response's bytes, which its waiting request holds
anyway for the echo. Identical bytes are the same response, known from a SHA-256 of the raw
bytes. Only when the bytes differ is the canonical fingerprint of both sides computed. When the
bytes are about to go (the member's request is answered or leaves) and the member's identity
must outlive them (a finished record that answers replays), ``settle`` keeps the raw digest and
the canonical fingerprint and drops the view; when it need not, ``release`` just drops it.

A plain 32-byte canonical fingerprint (``canonical.fingerprint``) is accepted wherever an
identity is, so callers that already have one compare the same way.
"""

from __future__ import annotations

import hashlib
import time
from typing import Protocol

from genrm_trio.core.canonical import fingerprint_json

__all__ = ["IdentityWork", "ResponseIdentity", "same_response"]


class IdentityWork(Protocol):
    """Counters of the work identities do (I-23 counts fingerprint computations)."""

    response_digests: int
    canonical_fingerprints: int

    def fingerprint_took(self, seconds: float) -> None:
        """One canonical fingerprint was computed in ``seconds`` (§9.3)."""


class ResponseIdentity:
    """One response's identity; holds its raw bytes until settled or released."""

    __slots__ = ("_canonical", "_digest", "_raw", "_work")

    def __init__(
        self,
        raw: bytes | memoryview,
        work: IdentityWork | None = None,
        *,
        known: tuple[bytes, bytes] | None = None,
    ) -> None:
        """``known``: the raw digest and canonical fingerprint, already computed elsewhere."""
        self._raw: bytes | memoryview | None = raw
        self._digest: bytes | None = None
        self._canonical: bytes | None = None
        if known is not None:
            self._digest, self._canonical = known
        self._work = work

    @classmethod
    def settled_from(cls, digest: bytes | None, canonical: bytes) -> ResponseIdentity:
        """An identity already settled elsewhere (kept by a shared store): no bytes, and the
        raw digest only if it was known."""
        identity = cls(b"")
        identity._raw = None
        identity._digest = digest
        identity._canonical = canonical
        return identity

    @property
    def holds_bytes(self) -> bool:
        return self._raw is not None

    @property
    def settled(self) -> bool:
        """It keeps its digest and canonical fingerprint and no longer needs the bytes."""
        return self._raw is None and self._canonical is not None

    def digest(self) -> bytes | None:
        """SHA-256 of the raw bytes; None once the bytes went without being settled."""
        if self._digest is None and self._raw is not None:
            self._digest = hashlib.sha256(self._raw).digest()
            if self._work is not None:
                self._work.response_digests += 1
        return self._digest

    def canonical(self) -> bytes:
        """The canonical fingerprint (C-21), computed from the bytes the first time."""
        if self._canonical is None:
            if self._raw is None:
                raise RuntimeError("the response's bytes were released before its fingerprint")
            started = time.perf_counter()
            self._canonical = fingerprint_json(self._raw)
            if self._work is not None:
                self._work.canonical_fingerprints += 1
                self._work.fingerprint_took(time.perf_counter() - started)
        return self._canonical

    def settle(self) -> None:
        """Keep what comparing needs without the bytes: the raw digest, for exact replays, and
        the canonical fingerprint, for the rest."""
        if self._raw is None:
            return
        self.digest()
        self.canonical()
        self._raw = None

    def release(self) -> None:
        """Nothing will compare against this identity again: let the bytes go."""
        self._raw = None


def same_response(kept: ResponseIdentity | bytes, arriving: ResponseIdentity | bytes) -> bool:
    """Whether two responses are the same under C-20; ``kept`` is the member's."""
    if isinstance(kept, bytes) and isinstance(arriving, bytes):
        return kept == arriving
    if isinstance(kept, ResponseIdentity) and isinstance(arriving, ResponseIdentity):
        kept_digest = kept.digest()
        if kept_digest is not None and kept_digest == arriving.digest():
            return True  # the same bytes
    kept_fingerprint = kept if isinstance(kept, bytes) else kept.canonical()
    arriving_fingerprint = arriving if isinstance(arriving, bytes) else arriving.canonical()
    return kept_fingerprint == arriving_fingerprint
