"""Per-request CPU of one large /verify body (goal 1 in docs/performance.md): decode and
validation, response identity, prompt digest, compaction and echo, against baselines measured
in the same run; the main ratio is against the msgspec validation floor (the whole body checked
by msgspec, nothing built).

Caveat: CPU time of this one thread (time.thread_time), measured in one process on whatever
machine runs it; the first line printed names it. The figures are for the request's own work in
the server (the steps Engine.verify and the row rendering run, called the same way), not HTTP,
scheduling or judging (benchmarks/bench_http.py measures those). The steps run interleaved,
round after round, so that other load on the machine touches every step alike; compare ratios
across runs, not absolute figures. The body is what NeMo Gym sends for one rollout: a Responses
object whose assistant message carries prompt token ids, generated token ids and log-probs
(float32 values widened to Python floats, 16-17 significant digits each), written by Python's
json.dumps. Baselines: the validation floor is msgspec checking the whole body into a Struct
without fields (what any validating server must at least do); SHA-256 of the response's raw
bytes; the reference is SHA-256 of sorted-keys JSON of the decoded response (stdlib json, and
msgspec as a fast encoder), the decoded object given.

A new member's request no longer computes a fingerprint: its response is known by its raw bytes
(C-24). The canonical fingerprint and the raw digest are computed when a finished group keeps
the member for replays ("keep the fingerprint"), after its reply is written; an exact retry
costs one SHA-256 of its raw bytes. The fingerprint from raw bytes packs the response's long
arrays of numbers piece by piece; the row marked "before" decodes the whole text at once (the
same fingerprint).

    python benchmarks/bench_request_cpu.py              # 65,536 generated + 16,384 prompt ids
    python benchmarks/bench_request_cpu.py --short      # 8,192 + 2,048, fewer rounds
    python benchmarks/bench_request_cpu.py --tokens 256 # any size (the HTTP benchmark's: 256)
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import cast

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    BodyShape,
    cpu_times,
    machine_line,
    ms,
    parser,
    ratio,
    table,
    verify_body,
)

from genrm_trio.config import Config
from genrm_trio.core import canonical
from genrm_trio.core.canonical import (
    digest_hex,
    fingerprint_decoded,
    fingerprint_json,
)
from genrm_trio.core.identity import ResponseIdentity
from genrm_trio.core.texts import convert_history, extract_scoring_text
from genrm_trio.wire.bodies import VerifyRequest
from genrm_trio.wire.parsing import parse_verify_body
from genrm_trio.wire.rendering import scored_row_parts

METRICS = {
    "genrm_failed_comparison_rate_per_group": 0.0,
    "genrm_masked_rollout_rate_per_group": 0.0,
    "mean_individual_score": 3.0,
    "std_individual_score": 1.25,
    "tiebreak_usage_rate": 0.0625,
}


def scored_row(request: VerifyRequest) -> bytes:
    """The scored row as /verify sends it for a body in memory: its parts, joined."""
    return b"".join(cast(list[bytes | memoryview], scored_row_parts(request, 3.5, METRICS)))


# Goal 1, for the body of 65,536 generated and 16,384 prompt tokens.
TARGET_WHOLE_MS = 2.0
TARGET_FINGERPRINT_MS = 1.0

WHOLE = "whole request, new member (parse, prompt digest, scoring texts, echo)"
KEPT = "whole request + keep the fingerprint in a finished group (after the reply)"
RETRY = "exact retry (parse, raw digest, echo)"
SETTLE = "keep the fingerprint: raw digest + canonical fingerprint"
FINGERPRINT = "fingerprint of the decoded response (before: on every request)"
VALIDATION_FLOOR = "floor: msgspec validation of the whole body, nothing built"
FLOOR = "SHA-256 of the raw response bytes"
JSON_REFERENCE = "reference: json sorted keys + SHA-256"
VALIDATE_ONLY = "bound: validate the body but the log-probs, values skipped (msgspec)"
PARSE_LOG_PROBS = "bound: parse the log-probs alone into floats (msgspec)"
MSGSPEC_REFERENCE = "reference: msgspec sorted JSON + SHA-256"


class _Nothing(msgspec.Struct):
    """Decoding into a Struct without fields checks the whole text and keeps nothing."""


def main() -> None:
    arguments = parser(__doc__.splitlines()[0])
    arguments.add_argument("--tokens", type=int, help="generated tokens (prompt: a quarter)")
    args = arguments.parse_args()
    tokens = args.tokens or (8_192 if args.short else 65_536)
    shape = BodyShape(generated_tokens=tokens, prompt_tokens=tokens // 4)
    repeat = 60 if args.short else 120
    config = Config(judge_base_url="http://127.0.0.1:1/v1", judge_model="judge")
    body = verify_body(shape, seed=1, group_id="g-1", slot=3)
    request = parse_verify_body(body, config)
    raw = bytes(request.response_view())
    may_hold_nan = request.response_may_hold_nan
    scoring_view, input_value = request.take_scoring()
    decoded = request.response_value
    validate_only = msgspec.json.Decoder(_Nothing)
    parse_floats = msgspec.json.Decoder(list[float])
    start = body.index(b"[", body.index(b'"generation_log_probs"'))
    end = body.index(b"]", start) + 1
    log_probs = body[start:end]
    without_log_probs = body[:start] + b"[]" + body[end:]

    def whole_request() -> bytes:
        # What Engine.verify does for a new member (take the scoring view and prompt input,
        # note the response's bytes, prompt digest, scoring texts), then the reply.
        parsed = parse_verify_body(body, config)
        response, prompt = parsed.take_scoring()
        ResponseIdentity(parsed.response_view())
        digest_hex({"input": prompt, "principle": parsed.principle})
        extract_scoring_text(response)
        del response, prompt
        return scored_row(parsed)

    def kept_request() -> None:
        # The same, and then what a finished group keeps once the reply is out (C-34).
        parsed = parse_verify_body(body, config)
        response, prompt = parsed.take_scoring()
        identity = ResponseIdentity(parsed.response_view())
        digest_hex({"input": prompt, "principle": parsed.principle})
        extract_scoring_text(response)
        del response, prompt
        scored_row(parsed)
        identity.settle()

    def exact_retry() -> bytes:
        # A request for an occupied slot with the member's bytes: one digest to compare.
        parsed = parse_verify_body(body, config)
        _, prompt = parsed.take_scoring()
        digest_hex({"input": prompt, "principle": parsed.principle})
        ResponseIdentity(parsed.response_view()).digest()
        return scored_row(parsed)

    def settle() -> None:
        ResponseIdentity(raw).settle()

    steps = [
        (VALIDATION_FLOOR, lambda: validate_only.decode(body)),
        # Includes freeing the decoded parts, as the server does once the member is stored.
        ("decode and validate the body", lambda: parse_verify_body(body, config)),
        (
            "prompt digest",
            lambda: digest_hex({"input": input_value, "principle": request.principle}),
        ),
        ("compaction: scoring texts", lambda: extract_scoring_text(scoring_view)),
        ("compaction: history (a group's first member)", lambda: convert_history(input_value)),
        ("echo: render the scored row", lambda: scored_row(request)),
        (WHOLE, whole_request),
        (RETRY, exact_retry),
        (SETTLE, settle),
        (KEPT, kept_request),
        (FINGERPRINT, lambda: fingerprint_decoded(decoded, may_hold_nan=may_hold_nan)),
        ("fingerprint from raw bytes, decode included", lambda: fingerprint_json(raw)),
        (
            "before: fingerprint from raw bytes, the whole text decoded at once",
            lambda: canonical._decoded_fingerprint(raw),
        ),
        (FLOOR, lambda: hashlib.sha256(raw).digest()),
        (
            MSGSPEC_REFERENCE,
            lambda: hashlib.sha256(msgspec.json.encode(decoded, order="sorted")).digest(),
        ),
        (
            JSON_REFERENCE,
            lambda: hashlib.sha256(
                json.dumps(decoded, sort_keys=True, separators=(",", ":")).encode()
            ).digest(),
        ),
        ("reference: msgspec decode of the whole body", lambda: msgspec.json.decode(body)),
        (VALIDATE_ONLY, lambda: validate_only.decode(without_log_probs)),
        (PARSE_LOG_PROBS, lambda: parse_floats.decode(log_probs)),
    ]
    timings = cpu_times(steps, repeat=repeat)

    floor = timings[FLOOR].median
    validation = timings[VALIDATION_FLOOR].median
    print(f"# Per-request CPU of one /verify body ({'short' if args.short else 'full'} run)")
    print(f"machine: {machine_line()}")
    print(
        f"body: {len(body):,} bytes ({len(raw):,} of them the response): "
        f"{shape.generated_tokens:,} generated token ids and log-probs, "
        f"{shape.prompt_tokens:,} prompt token ids; {repeat} interleaved rounds"
    )
    print()
    rows = [
        [name, ms(timing.median), ms(timing.p95), ratio(timing.median, validation)]
        for name, timing in timings.items()
    ]
    print(table(["step", "median ms", "p95 ms", "vs validation floor"], rows))
    print()
    fingerprint = timings[FINGERPRINT].median
    whole = timings[WHOLE].median
    print(
        f"fingerprint: {ms(fingerprint)} ms, {ratio(fingerprint, floor)} the raw SHA-256 "
        f"floor; sorted-keys json + SHA-256 takes "
        f"{ratio(timings[JSON_REFERENCE].median, fingerprint)} as long, msgspec sorted JSON + "
        f"SHA-256 {ratio(timings[MSGSPEC_REFERENCE].median, fingerprint)}"
    )
    print(f"whole request: {ms(whole)} ms ({len(body) / whole / 1e6:.0f} MB/s)")
    kept = timings[KEPT].median
    print(
        f"against the msgspec validation floor ({ms(validation)} ms): a new member's request "
        f"{ratio(whole, validation)} (goal: at most 1.50x), an exact retry "
        f"{ratio(timings[RETRY].median, validation)}; with the fingerprint a finished group "
        f"keeps, computed after the reply: {ratio(kept, validation)}"
    )
    # Any exact method must at least check the whole text (bad JSON is a 400) and know the bits
    # of every log-prob (0.1 and 0.10000000000000001 are one class under C-20); parsing the
    # log-probs checks their part of the text.
    bound = timings[VALIDATE_ONLY].median + timings[PARSE_LOG_PROBS].median
    print(
        f"lower bound with msgspec: validating the rest {ms(timings[VALIDATE_ONLY].median)} ms "
        f"+ parsing the log-probs {ms(timings[PARSE_LOG_PROBS].median)} ms = {ms(bound)} ms; "
        f"the whole request is {ratio(whole, bound)} that"
    )
    if tokens == 65_536:
        print(
            f"goal 1: whole request <= {TARGET_WHOLE_MS} ms: "
            f"{'met' if whole * 1e3 <= TARGET_WHOLE_MS else 'not met'}; fingerprint <= "
            f"{TARGET_FINGERPRINT_MS} ms: "
            f"{'met' if fingerprint * 1e3 <= TARGET_FINGERPRINT_MS else 'not met'}"
        )


if __name__ == "__main__":
    main()
