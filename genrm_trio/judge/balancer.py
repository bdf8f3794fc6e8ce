"""Which judge replica an attempt goes to: plain bookkeeping, no I/O and no awaits (X-3).

Theory of operation. The judge client asks :meth:`Balancer.choose` for a replica before every
attempt and reports back with :meth:`Balancer.finished` when the attempt ends; nothing here
sleeps, waits or looks at a clock of its own (``now`` is passed in).

- *Affinity.* Every comparison of one group carries the group's key. Under the ``affinity``
  policy the replicas are ranked for that key by rendezvous hashing (highest hash of key and
  replica first), so all of a group's comparisons prefer the same replica, where the judge's
  prefix cache already holds the group's conversation, and the ejection of one replica moves only
  the groups that preferred it. The preferred replica is skipped while it has clearly more
  attempts in flight than its share: a replica takes another attempt only while its count stays
  within ``load_factor`` times the mean over replicas in service, counting the new attempt
  (consistent hashing with bounded loads); otherwise the next replica in the key's ranking that
  is within the bound takes it. Without a key, or under ``least_outstanding``, the replica with
  the fewest attempts in flight takes it (ties go to the lower index).
- *Ejection.* ``eject_after`` consecutive failures of a replica in service (transport failures,
  5xx replies, attempts past their deadline) eject it for ``cooldown_s``. When the cool-down has
  passed, the next attempt that may probe goes to it alone: success puts it back in service, a
  failure ejects it for another cool-down. Attempts that started before an ejection and end
  after it do not change the replica's state.
- *Retries* name the replica of their previous attempt as ``avoid``; it is used only when no
  other replica can take the attempt.
- *Caps.* With ``per_replica_cap``, a replica at its cap takes nothing more; when every replica
  that could take the attempt is at its cap, ``choose`` returns None and the caller waits for an
  attempt to end.
- *No replica in service.* When every replica is ejected (and none is due for a probe), the
  attempt goes to the replica whose cool-down ends first: refusing to send would only turn an
  outage of every replica into failures sooner than the attempt budget would. With one replica,
  ejection therefore never changes where attempts go.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

BalancePolicy = Literal["affinity", "least_outstanding"]


@dataclass(slots=True)
class Replica:
    """One judge replica's state, as the balancer keeps it."""

    url: str
    in_flight: int = 0
    consecutive_failures: int = 0
    ejected_until: float | None = None  # None: in service
    probing: bool = False  # the one probe attempt after a cool-down is out
    ejections: int = 0
    attempts: int = 0

    @property
    def in_service(self) -> bool:
        return self.ejected_until is None


class Pick(NamedTuple):
    """The replica chosen for one attempt; ``probe`` marks the attempt that tests an ejected
    replica after its cool-down."""

    replica: int
    probe: bool


_ONLY = Pick(0, False)


class Balancer:
    """Replica choice for every judge attempt of one server."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        policy: BalancePolicy = "affinity",
        per_replica_cap: int | None = None,
        eject_after: int = 3,
        cooldown_s: float = 10.0,
        load_factor: float = 1.25,
    ) -> None:
        if not urls:
            raise ValueError("at least one replica is required")
        if eject_after < 1:
            raise ValueError("eject_after must be at least 1")
        if load_factor < 1:
            raise ValueError("load_factor must be at least 1")
        self.replicas = [Replica(url) for url in urls]
        self.policy = policy
        self.per_replica_cap = per_replica_cap
        self.eject_after = eject_after
        self.cooldown_s = cooldown_s
        self.load_factor = load_factor
        # Each replica's hash key: a digest of its URL (blake2b keys are at most 64 bytes).
        self._seeds = [hashlib.blake2b(url.encode()).digest()[:32] for url in urls]
        # One judge, the common case: it is never ejected, so only its cap decides, and choosing
        # and reporting take the short way.
        self._only = self.replicas[0] if len(urls) == 1 else None

    # ---- choosing ----------------------------------------------------------------------------

    def choose(
        self, key: str | None, now: float, *, avoid: int | None = None, may_probe: bool = True
    ) -> Pick | None:
        """The replica for the next attempt, counted as in flight; None when every replica that
        could take it is at its cap."""
        only = self._only
        if only is not None:
            if self.per_replica_cap is not None and only.in_flight >= self.per_replica_cap:
                return None
            only.in_flight += 1
            only.attempts += 1
            return _ONLY
        pick = self._pick(key, now, avoid, may_probe)
        if pick is not None:
            replica = self.replicas[pick.replica]
            replica.in_flight += 1
            replica.attempts += 1
            if pick.probe:
                replica.probing = True
        return pick

    def _pick(self, key: str | None, now: float, avoid: int | None, may_probe: bool) -> Pick | None:
        replicas = self.replicas
        if may_probe:
            for index, replica in enumerate(replicas):
                if index != avoid and self._due_for_probe(replica, now) and self._room(replica):
                    return Pick(index, True)
        serving = [i for i, r in enumerate(replicas) if r.in_service]
        if not serving:
            return self._fallback(now)
        open_ = [i for i in serving if self._room(replicas[i])]
        if not open_:
            return None
        if len(open_) == 1:
            return Pick(open_[0], False)  # one judge (the common case): nothing to rank
        if avoid is not None and len(open_) > 1 and avoid in open_:
            open_.remove(avoid)
        if self.policy == "affinity" and key is not None:
            return Pick(self._bounded_affinity(key, open_, serving), False)
        return Pick(min(open_, key=lambda i: replicas[i].in_flight), False)

    def _bounded_affinity(self, key: str, open_: list[int], serving: list[int]) -> int:
        replicas = self.replicas
        total = sum(replicas[i].in_flight for i in serving)
        bound = math.ceil(self.load_factor * (total + 1) / len(serving))
        ranked = self.ranking(key, open_)
        for index in ranked:
            if replicas[index].in_flight + 1 <= bound:
                return index
        return min(ranked, key=lambda i: replicas[i].in_flight)

    def ranking(self, key: str, indexes: Sequence[int] | None = None) -> list[int]:
        """Replica indexes in the key's order of preference (rendezvous hashing)."""
        if indexes is None:
            indexes = range(len(self.replicas))
        encoded = key.encode("utf-8", "surrogatepass")

        def weight(index: int) -> bytes:
            return hashlib.blake2b(encoded, digest_size=8, key=self._seeds[index]).digest()

        return sorted(indexes, key=weight, reverse=True)

    def _fallback(self, now: float) -> Pick | None:
        """Every replica is ejected: the one back soonest takes the attempt (no probe)."""
        candidates = [
            (replica.ejected_until or now, index)
            for index, replica in enumerate(self.replicas)
            if self._room(replica)
        ]
        if not candidates:
            return None
        return Pick(min(candidates)[1], False)

    def _room(self, replica: Replica) -> bool:
        cap = self.per_replica_cap
        return cap is None or replica.in_flight < cap

    def _due_for_probe(self, replica: Replica, now: float) -> bool:
        until = replica.ejected_until
        return until is not None and not replica.probing and now >= until

    # ---- reporting back ----------------------------------------------------------------------

    def finished(self, pick: Pick, *, failed: bool | None, now: float) -> bool:
        """The attempt on ``pick`` ended: ``failed`` True for a failure that counts against the
        replica, False for any reply that shows it serving, None when the attempt says nothing
        about it (cancelled). Returns True when this ejected the replica."""
        replica = self.replicas[pick.replica]
        replica.in_flight -= 1
        if self._only is not None:
            return False
        if pick.probe:
            replica.probing = False
            if failed is None:
                return False
            if failed:
                replica.ejected_until = now + self.cooldown_s
                replica.ejections += 1
                return True
            replica.ejected_until = None
            replica.consecutive_failures = 0
            return False
        if not replica.in_service or failed is None:
            return False
        if not failed:
            replica.consecutive_failures = 0
            return False
        replica.consecutive_failures += 1
        if replica.consecutive_failures < self.eject_after:
            return False
        replica.consecutive_failures = 0
        replica.ejected_until = now + self.cooldown_s
        replica.ejections += 1
        return True
