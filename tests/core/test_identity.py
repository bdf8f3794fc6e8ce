"""Response identity (C-21, C-24): raw bytes first, the canonical fingerprint only when needed."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from genrm_trio.core.canonical import fingerprint_json
from genrm_trio.core.identity import ResponseIdentity, same_response


@dataclass
class Work:
    response_digests: int = 0
    canonical_fingerprints: int = 0
    fingerprint_seconds: float = 0.0

    def fingerprint_took(self, seconds: float) -> None:
        self.fingerprint_seconds += seconds


def test_identical_bytes_match_on_their_digest_without_a_canonical_fingerprint() -> None:
    work = Work()
    kept = ResponseIdentity(b'{"a": [0.1, 2]}', work)
    assert same_response(kept, ResponseIdentity(memoryview(b'{"a": [0.1, 2]}'), work))
    assert (work.response_digests, work.canonical_fingerprints) == (2, 0)


def test_different_bytes_are_compared_by_canonical_fingerprint() -> None:
    work = Work()
    kept = ResponseIdentity(b'{"a": [0.1, 2], "b": null}', work)
    assert same_response(kept, ResponseIdentity(b'{"b":null,"a":[0.10000000000000001,2]}', work))
    assert not same_response(kept, ResponseIdentity(b'{"a": [0.1, 2.0], "b": null}', work))
    # The kept side's fingerprint is computed once and reused.
    assert work.canonical_fingerprints == 3


def test_settling_keeps_what_comparing_needs_and_lets_the_bytes_go() -> None:
    kept = ResponseIdentity(b'{"x": NaN}')
    kept.settle()
    assert kept.settled and not kept.holds_bytes
    assert kept.canonical() == fingerprint_json(b'{"x": NaN}')
    assert same_response(kept, ResponseIdentity(b'{"x": NaN}'))
    assert same_response(kept, ResponseIdentity(b'{ "x" : NaN }'))
    assert not same_response(kept, ResponseIdentity(b'{"x": null}'))


def test_a_plain_fingerprint_compares_like_an_identity() -> None:
    fingerprint = fingerprint_json(b'{"x": [1, 2]}')
    assert same_response(fingerprint, ResponseIdentity(b'{"x":[1,2]}'))
    assert same_response(ResponseIdentity(b'{"x":[1,2]}'), fingerprint)
    assert not same_response(fingerprint, fingerprint_json(b'{"x": [2, 1]}'))


def test_a_released_identity_cannot_be_compared_by_content() -> None:
    gone = ResponseIdentity(b'{"x": 1}')
    gone.release()
    assert not gone.holds_bytes and gone.digest() is None
    with pytest.raises(RuntimeError, match="released"):
        gone.canonical()
