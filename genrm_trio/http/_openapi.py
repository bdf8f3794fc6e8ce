"""The OpenAPI 3.1 document served at ``GET /openapi.json`` (W-51), generated from the wire types
in ``schema.py``; it is built once per server version and kept as encoded bytes."""

from __future__ import annotations

import functools
from typing import Any

import msgspec

from genrm_trio.http._openrlhf_endpoint import (
    ROUTE as OPENRLHF_ROUTE,
)
from genrm_trio.wire.group_bodies import VerifyGroupReply, VerifyGroupRequestDoc
from genrm_trio.wire.gym_bodies import (
    AggregateMetricsReply,
    AggregateMetricsRequestDoc,
    CloseSessionReply,
    CloseSessionRequestDoc,
    SeedSessionReply,
    SeedSessionRequestDoc,
)
from genrm_trio.wire.openrlhf_bodies import (
    OpenRLHFRewardReply,
    OpenRLHFRewardRequestDoc,
)
from genrm_trio.wire.schema import (
    CompareReply,
    CompareRequestDoc,
    ErrorReply,
    Healthz,
    MaskedRow,
    Readyz,
    VerifyRequestDoc,
    VerifyRow,
)

_JSON = "application/json"


def openapi_document(version: str) -> dict[str, Any]:
    """The document as a fresh mapping (callers may change it without touching the cache)."""
    document: dict[str, Any] = msgspec.json.decode(openapi_json(version))
    return document


@functools.lru_cache(maxsize=4)
def openapi_json(version: str) -> bytes:
    """The encoded document, ready to serve."""
    return msgspec.json.encode(_build(version))


def _build(version: str) -> dict[str, Any]:
    refs, components = msgspec.json.schema_components(
        [
            VerifyRequestDoc,
            VerifyRow,
            MaskedRow,
            CompareRequestDoc,
            CompareReply,
            Healthz,
            ErrorReply,
            SeedSessionRequestDoc,
            SeedSessionReply,
            AggregateMetricsRequestDoc,
            AggregateMetricsReply,
            CloseSessionRequestDoc,
            CloseSessionReply,
            VerifyGroupRequestDoc,
            VerifyGroupReply,
            OpenRLHFRewardRequestDoc,
            OpenRLHFRewardReply,
            Readyz,
        ],
        ref_template="#/components/schemas/{name}",
    )
    verify_request, verify_row, masked_row, compare_request, compare_reply, healthz, error = refs[
        :7
    ]
    seed_request, seed_reply, aggregate_request, aggregate_reply, close_request, close_reply = refs[
        7:13
    ]
    group_request, group_reply, openrlhf_request, openrlhf_reply, readyz = refs[13:]

    def reply(description: str, schema: dict[str, Any]) -> dict[str, Any]:
        return {"description": description, "content": {_JSON: {"schema": schema}}}

    def failure(description: str) -> dict[str, Any]:
        return reply(description, error)

    bad_json = failure(
        "The body is not parseable JSON, its top level is not an object, or it repeats a "
        "top-level key: `invalid JSON body: <reason>` or `duplicate key '<k>'`."
    )
    too_large = failure("The body is larger than max_body_bytes: `request body exceeds <n> bytes`.")
    invalid = failure(
        "The body violates the schema or a field rule: `<path>: <problem>`, naming the first "
        "offending field."
    )
    verify = {
        "post": {
            "operationId": "verify",
            "summary": "Score one rollout against the other rollouts of its group",
            "description": (
                "Waits until all N rollouts of the group have arrived and been judged, then "
                "answers with this rollout's row. Posting a row back replays it."
            ),
            "requestBody": {
                "required": True,
                "content": {_JSON: {"schema": verify_request}},
            },
            "responses": {
                "200": reply(
                    "A scored row, or a masked row (mask_sample true) when the rollout's "
                    "reward could not be measured.",
                    {"oneOf": [verify_row, masked_row]},
                ),
                "400": bad_json,
                "409": failure(
                    "The request conflicts with its group: a different response for an "
                    "occupied slot, inconsistent prompt or principle, or a superseded or "
                    "finished attempt."
                ),
                "413": too_large,
                "422": invalid,
                "503": failure(
                    "The group failed with a cohort-kind failure (collection deadline, "
                    "supersession, cancellation), or the server is shutting down."
                ),
            },
        }
    }
    verify_group = {
        "post": {
            "operationId": "verify_group",
            "summary": "Score a whole group in one request",
            "description": (
                "The prompt once and all num_rollouts_per_prompt responses in slot order, under "
                "one explicit group id and attempt. Each response is answered exactly as a "
                "/verify post of it would be (the same validation, grouping, attempts, replay, "
                "masking, 409 and 503), and the reply holds one compact row per slot, without "
                "the echo. A masked row has reward null. Sending the identical request again "
                "(after a lost connection, or a 503 that says to resend) attaches to the group "
                "or replays its rows without new judge calls. The first 409 or 503 of any slot "
                "is the answer for the whole request."
            ),
            "requestBody": {"required": True, "content": {_JSON: {"schema": group_request}}},
            "responses": {
                "200": reply("Every slot's row, scored or masked, in slot order.", group_reply),
                "400": bad_json,
                "409": failure(
                    "A slot conflicts with its group, as in /verify: a different response for an "
                    "occupied slot, inconsistent prompt or principle, or a superseded or "
                    "finished attempt."
                ),
                "413": too_large,
                "422": failure(
                    "The body violates the schema or a field rule: `<path>: <problem>`, naming "
                    "the first offending field (`responses[<i>].output: ...` for a response; "
                    "`responses: expected an array of <N> response objects "
                    "(num_rollouts_per_prompt), got ...` for the wrong count)."
                ),
                "503": failure(
                    "As in /verify: the group failed with a cohort-kind failure, the shared "
                    "group store is unavailable, or the server is shutting down."
                ),
            },
        }
    }
    openrlhf = {
        "post": {
            "operationId": "openrlhf_get_reward",
            "summary": "OpenRLHF's remote reward model protocol (--reward.remote_url)",
            "description": (
                "Samples are grouped by prompt: the samples of one prompt fill one group of "
                "num_rollouts_per_prompt slots in arrival order, across requests, and each is "
                "judged as its /verify post would be. A request waits until every group its "
                "samples joined is judged. A sample resent after its request went away without "
                "an answer takes its old slot again. A masked sample's reward and score are the "
                "masked_reward_placeholder, and extra_logs.genrm_masked is 1.0 for it. Groups "
                "are formed within one server process."
            ),
            "requestBody": {"required": True, "content": {_JSON: {"schema": openrlhf_request}}},
            "responses": {
                "200": reply(
                    "One reward, score and log entry per query, in order.", openrlhf_reply
                ),
                "400": bad_json,
                "409": failure("A sample conflicts with its group, as in /verify."),
                "413": too_large,
                "422": invalid,
                "503": failure(
                    "A group a sample joined failed (for example it did not collect all its "
                    "samples in time), every sample was masked because its group could not "
                    "reach the judge (openrlhf_fail_on_transport_mask), or the server is "
                    "shutting down."
                ),
            },
        }
    }
    compare = {
        "post": {
            "operationId": "compare",
            "summary": "Judge a batch of answers against each other, without state",
            "requestBody": {
                "required": True,
                "content": {_JSON: {"schema": compare_request}},
            },
            "responses": {
                "200": reply("One reward per answer, in input order.", compare_reply),
                "400": bad_json,
                "413": too_large,
                "422": invalid,
                "500": failure("A defect: `GenRM compare failed: <Type>: <message>`."),
                "503": failure(
                    "A comparison failed (the first judge error ends the call), the compare "
                    "deadline passed, or the server is shutting down."
                ),
            },
        }
    }
    seed_session = {
        "post": {
            "operationId": "seed_session",
            "summary": "NeMo Gym's per-rollout session seed; keeps no state",
            "requestBody": {"required": True, "content": {_JSON: {"schema": seed_request}}},
            "responses": {
                "200": reply(
                    "An empty object, or the resources_session_id an environment server sent.",
                    seed_reply,
                ),
                "400": bad_json,
                "413": too_large,
                "422": invalid,
            },
        }
    }
    close_session = {
        "post": {
            "operationId": "close_session",
            "summary": "NeMo Gym's session close; there is no state to release",
            "requestBody": {"required": True, "content": {_JSON: {"schema": close_request}}},
            "responses": {
                "200": reply("The session id, confirmed closed.", close_reply),
                "400": bad_json,
                "413": too_large,
                "422": invalid,
            },
        }
    }
    aggregate = {
        "post": {
            "operationId": "aggregate_metrics",
            "summary": "Run metrics over finished rows, in NeMo Gym's AggregateMetrics shape",
            "description": (
                "NeMo Gym's keys with Gym's definitions (statistics over the rows that are not "
                "masked, the sample standard deviation, repeat-level metrics and their "
                "aggregates across repeats, coverage), plus genrm-trio's counts: rows, scored, "
                "failed, rollouts, masked_by_server, mask_rate and failures/<class>, which "
                "include the rollouts of these rows' groups that the server answered masked "
                "even when they are not among the rows. group_level_metrics has one entry per "
                "_ng_task_index."
            ),
            "requestBody": {"required": True, "content": {_JSON: {"schema": aggregate_request}}},
            "responses": {
                "200": reply("The metrics, overall and per task.", aggregate_reply),
                "400": bad_json,
                "413": too_large,
                "422": invalid,
            },
        }
    }
    reverify_mode = {
        "get": {
            "operationId": "reverify_mode",
            "summary": "NeMo Gym's reverify mode: unsupported (a group judge cannot re-score one "
            "stored row on its own)",
            "responses": {
                "200": reply(
                    "Always the string `unsupported`.", {"type": "string", "enum": ["unsupported"]}
                )
            },
        }
    }
    health = {
        "get": {
            "operationId": "healthz",
            "summary": "Liveness and state counts; never calls the judge",
            "responses": {
                "200": reply("Serving.", healthz),
                "503": reply("Shutdown has begun (status shutting_down).", healthz),
            },
        }
    }
    ready = {
        "get": {
            "operationId": "readyz",
            "summary": "Readiness: a judge replica answered its last probe and the group store "
            "is available; never calls the judge beyond the probes",
            "responses": {
                "200": reply("Ready (status ready).", readyz),
                "503": reply(
                    "Not ready (status not_ready, with reasons naming each failing judge "
                    "replica's URL and last error, or the group store), or shutting down "
                    "(status shutting_down).",
                    readyz,
                ),
            },
        }
    }
    metrics = {
        "get": {
            "operationId": "metrics",
            "summary": "Server metrics in the Prometheus text format; no series has a group id",
            "responses": {
                "200": {
                    "description": "The exposition, version 0.0.4.",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                }
            },
        }
    }
    openapi = {
        "get": {
            "operationId": "openapi",
            "summary": "This document",
            "responses": {"200": reply("The OpenAPI 3.1 document.", {"type": "object"})},
        }
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "genrm-trio",
            "version": version,
            "description": (
                "Turns groups of RL rollouts into rewards with a pairwise generative reward "
                "model. Judge failures come back as masked rows, never as zero rewards."
            ),
        },
        "paths": {
            "/verify": verify,
            "/verify_group": verify_group,
            OPENRLHF_ROUTE: openrlhf,
            "/compare": compare,
            "/seed_session": seed_session,
            "/close_session": close_session,
            "/reverify_mode": reverify_mode,
            "/aggregate_metrics": aggregate,
            "/healthz": health,
            "/readyz": ready,
            "/metrics": metrics,
            "/openapi.json": openapi,
        },
        "components": {"schemas": components},
    }
