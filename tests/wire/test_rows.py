"""Rendering /verify rows and the small replies: byte-exact echo, key order, coordinates,
masked rows and their bounded text (W-20…W-33, W-3, W-50, AS-23, AS-24, AS-26, AS-28, AS-29)."""

from __future__ import annotations

import json
import math
from typing import Any

import msgspec
import pytest
from row_texts import masked_row, response_bytes, scored_row

from genrm_trio.config import Config
from genrm_trio.core.messages import MIGRATION_SUFFIX
from genrm_trio.wire.bodies import VerifyRequest
from genrm_trio.wire.parsing import parse_verify_body
from genrm_trio.wire.rendering import (
    bound_failure_text,
    error_body,
    render_healthz,
    render_readyz,
)
from genrm_trio.wire.schema import Healthz, JudgeReplicaState, MaskedRow, Readyz, VerifyRow

GROUP = Config(judge_base_url="http://judge/v1", judge_model="m", num_rollouts_per_prompt=2)
SINGLE = Config(judge_base_url="http://judge/v1", judge_model="m", num_rollouts_per_prompt=1)
METRICS = {
    "tiebreak_usage_rate": 0.5,
    "std_individual_score": 1.0,
    "mean_individual_score": 3.0,
    "genrm_masked_rollout_rate_per_group": 0.0,
    "genrm_failed_comparison_rate_per_group": 0.25,
}
SCORED_TAIL = ["reward", "mask_sample", "failure_kind", "failure_reason"]
METRIC_ORDER = [
    "genrm_failed_comparison_rate_per_group",
    "genrm_masked_rollout_rate_per_group",
    "mean_individual_score",
    "std_individual_score",
    "tiebreak_usage_rate",
]
MASKED_TAIL = [
    "reward",
    "mask_sample",
    "failure_kind",
    "failure_reason",
    "_ng_failure_class",
    "_ng_failure_judge_error",
]

TOKENS = b"[" + b", ".join(str(7 * i % 151_000).encode() for i in range(1024)) + b"]"
# AS-24: every spelling below must come back byte for byte.
RESPONSE = (
    b'{"id": "resp-1",  "output": ['
    b'{"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},'
    b' {"type": "message", "role": "assistant", "content": ['
    b'{"type": "output_text", "text": "h\xc3\xa9llo"}, {"type": "output_text", "text": "\\ud800"},'
    b' {"type": "refusal", "refusal": "no"}]},'
    b' {"type": "function_call", "name": "f", "arguments": "{\\"x\\": 1}", "call_id": "c"}],'
    b' "generation_token_ids": ' + TOKENS + b', "prompt_token_ids" :' + TOKENS + b","
    b' "generation_log_probs": [-0.5, -1E-3, 0.0, -0.0, -1.50], "big": 1208925819614629174706176,'
    b' "dup": 1, "dup": 2, "nested": { "a" : [ 1 ,2 ] }}'
)
PARAMS = b'{"input": [{"role": "user", "content": "2+2?"}], "temperature": 1.0}'
TASK = b'{"k": [1, 2]}'


def row_pairs(row: bytes) -> list[tuple[str, Any]]:
    """The row's top-level members in order, duplicates kept (Python's json reads NaN)."""
    pairs: list[tuple[str, Any]] = json.loads(row, object_pairs_hook=lambda pairs: pairs)
    return pairs


def keys(row: bytes) -> list[str]:
    return [key for key, _ in row_pairs(row)]


def as_dict(row: bytes) -> dict[str, Any]:
    return dict(json.loads(row))


def parse(text: bytes, config: Config = GROUP) -> VerifyRequest:
    return parse_verify_body(text, config)


def full_request() -> bytes:
    return (
        b'{"responses_create_params": ' + PARAMS + b', "response": ' + RESPONSE + b","
        b' "_ng_rollout_id": "rid-9", "task": ' + TASK + b', "_ng_group_id": "g",'
        b' "_ng_group_attempt": 1, "_ng_rollout_index": 1}'
    )


def test_a_scored_row_echoes_every_value_byte_for_byte() -> None:
    row = scored_row(parse(full_request()), 4.25, METRICS)
    assert b'"response":' + RESPONSE + b"," in row
    assert b'"responses_create_params":' + PARAMS + b"," in row
    assert b'"task":' + TASK + b"," in row
    for spelling in (TOKENS, b"-1E-3", b"-1.50", b"1208925819614629174706176", b'"\\ud800"'):
        assert spelling in row
    assert "héllo".encode() in row


def test_a_scored_row_has_the_w20_keys_in_order() -> None:
    row = scored_row(parse(full_request()), 4.25, METRICS)
    request_keys = ["responses_create_params", "response", "task", "_ng_group_id"]
    coordinates = ["_ng_group_attempt", "_ng_rollout_index", "_ng_task_index"]
    assert keys(row) == request_keys + coordinates + SCORED_TAIL + METRIC_ORDER
    values = as_dict(row)
    assert values["_ng_task_index"] is None
    assert (values["reward"], values["mask_sample"]) == (4.25, False)
    assert (values["failure_kind"], values["failure_reason"]) == (None, None)
    assert [values[key] for key in METRIC_ORDER] == [0.25, 0.0, 3.0, 1.0, 0.5]
    for absent in ("_ng_rollout_id", "group_id", "group_attempt", "rollout_index", "task_index"):
        assert absent not in values


def test_present_coordinates_keep_their_place_in_canonical_json() -> None:
    text = (
        b'{"_ng_rollout_index" : 1, "response": {"output": []}, "_ng_group_id":"g\xc3\xa9",'
        b' "responses_create_params": {"input": "q"}}'
    )
    row = scored_row(parse(text), 3.0, None)
    assert row == (
        b'{"_ng_rollout_index":1,"response":{"output": []},"_ng_group_id":"g\\u00e9",'
        b'"responses_create_params":{"input": "q"},"_ng_group_attempt":0,"_ng_task_index":null,'
        b'"reward":3.0,"mask_sample":false,"failure_kind":null,"failure_reason":null}'
    )


def test_absent_coordinates_are_added_in_order_with_their_effective_values() -> None:
    text = b'{"responses_create_params": {"input": "q"}, "response": {"output": []}, "x": 1}'
    row = scored_row(parse(text, SINGLE), 3.0, None)
    assert row == (
        b'{"responses_create_params":{"input": "q"},"response":{"output": []},"x":1,'
        b'"_ng_group_id":null,"_ng_group_attempt":0,"_ng_rollout_index":null,'
        b'"_ng_task_index":null,"reward":3.0,"mask_sample":false,"failure_kind":null,'
        b'"failure_reason":null}'
    )


def test_plain_coordinate_names_are_echoed_only_when_sent() -> None:
    text = full_request()[:-1] + b', "group_id": "mine", "task_index": [3]}'
    values = as_dict(scored_row(parse(text), 3.0, None))
    assert (values["group_id"], values["task_index"]) == ("mine", [3])
    assert "group_attempt" not in values and "rollout_index" not in values


def test_non_standard_literals_are_echoed_unchanged() -> None:
    text = full_request().replace(b'"big": ', b'"lp": [NaN, Infinity, -Infinity, -0.5], "big": ')
    row = scored_row(parse(text), 3.0, None)
    assert b'"lp": [NaN, Infinity, -Infinity, -0.5]' in row
    lp = as_dict(row)["response"]["lp"]
    assert math.isnan(lp[0]) and lp[1:] == [math.inf, -math.inf, -0.5]


def test_client_values_of_server_owned_keys_are_replaced_each_key_once() -> None:
    text = full_request()[:-1] + (
        b', "reward": 7, "mask_sample": true, "failure_reason": "x",'
        b' "tiebreak_usage_rate": NaN, "_ng_failure_class": "judge_failed"}'
    )
    row = scored_row(parse(text), 2.0, METRICS)
    names = keys(row)
    for key in ["reward", "mask_sample", "failure_reason", "tiebreak_usage_rate"]:
        assert names.count(key) == 1
    values = as_dict(row)
    assert (values["reward"], values["mask_sample"], values["failure_reason"]) == (2.0, False, None)
    assert values["tiebreak_usage_rate"] == 0.5
    assert "_ng_failure_class" not in values


def test_rewards_are_written_as_shortest_round_trip_floats() -> None:
    request = parse(full_request())
    assert b'"reward":3.0,' in scored_row(request, 3, None)
    assert b'"reward":0.30000000000000004,' in scored_row(request, 0.1 + 0.2, None)
    assert b'"reward":-1e-05,' in scored_row(request, -0.00001, None)
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match="finite"):
            scored_row(request, bad, None)


def test_single_rollout_rows_carry_no_group_metrics() -> None:
    row = scored_row(parse(full_request(), SINGLE), 3.0, None)
    assert not set(METRIC_ORDER) & set(keys(row))


def test_a_scored_row_posted_back_is_the_same_request() -> None:
    request = parse(full_request())
    row = scored_row(request, 4.25, METRICS)
    again = parse(row)
    assert response_bytes(again) == response_bytes(request) == RESPONSE
    assert (again.group_id, again.attempt, again.rollout_index, again.task_index) == (
        "g",
        1,
        1,
        None,
    )
    assert again.attempt_given
    assert scored_row(again, 4.25, METRICS) == row


def test_scored_and_masked_rows_decode_as_the_documented_types() -> None:
    request = parse(full_request().replace(b', "\\ud800"', b', "x"').replace(b"\\ud800", b"x"))
    scored = msgspec.json.decode(scored_row(request, 4.25, METRICS), type=VerifyRow)
    assert (scored.reward, scored.mask_sample, scored.ng_group_id) == (4.25, False, "g")
    masked = msgspec.json.decode(masked_row(request, "boom"), type=MaskedRow)
    assert (masked.mask_sample, masked.failure_reason, masked.ng_failure_class) == (
        True,
        "boom",
        "judge_failed",
    )


# --- masked rows (W-30…W-33, AS-28, AS-29) ----------------------------------------------------


def with_instance_config(raw: bytes | None) -> VerifyRequest:
    text = full_request()
    if raw is not None:
        text = text[:-1] + b', "instance_config": ' + raw + b', "after": 1}'
    return parse(text)


def test_a_masked_row_carries_the_failure_and_no_metrics() -> None:
    text = (
        "GenRM rollout_index=1 lost a comparison to a judge failure (1 of 2 comparisons failed): x"
    )
    row = masked_row(with_instance_config(b'{"task": "keep"}'), text)
    assert b'"response":' + RESPONSE + b"," in row
    names = keys(row)
    assert names[-len(MASKED_TAIL) :] == MASKED_TAIL
    assert not set(METRIC_ORDER) & set(names)
    values = as_dict(row)
    assert (values["reward"], values["mask_sample"], values["failure_kind"]) == (
        0.0,
        True,
        "judge_failed",
    )
    assert values["failure_reason"] == values["_ng_failure_judge_error"] == text
    assert values["_ng_failure_class"] == "judge_failed"
    assert b'"reward":0.0,' in row


def test_an_object_instance_config_gains_mask_sample_in_place() -> None:
    row = masked_row(with_instance_config(b'{"task": "keep"}'), "boom")
    assert b'"instance_config":{"task":"keep","mask_sample":true},"after":1,' in row
    names = keys(row)
    assert names.index("instance_config") < names.index("after") < names.index("_ng_task_index")


def test_an_existing_mask_sample_is_set_where_it_stands_and_other_values_keep_their_bytes() -> None:
    raw = b'{"mask_sample": false, "lp": [NaN, 1.50], "mask_sample": 0, "z": {"a":1,"a":2}}'
    row = masked_row(with_instance_config(raw), "boom")
    assert b'"instance_config":{"mask_sample":true,"lp":[NaN, 1.50],"z":{"a":1,"a":2}}' in row


@pytest.mark.parametrize("raw", [b'"x"', b"null", b"[1]", b"7"])
def test_an_instance_config_that_is_not_an_object_is_replaced(raw: bytes) -> None:
    row = masked_row(with_instance_config(raw), "boom")
    assert b'"instance_config":{"mask_sample":true},"after":1,' in row


def test_an_absent_instance_config_is_added_after_the_request_keys() -> None:
    text = b'{"responses_create_params": {"input": "q"}, "response": {"output": []}, "x": 1}'
    row = masked_row(parse(text, SINGLE), "boom")
    assert keys(row)[:5] == [
        "responses_create_params",
        "response",
        "x",
        "instance_config",
        "_ng_group_id",
    ]
    assert as_dict(row)["instance_config"] == {"mask_sample": True}


def test_the_scored_row_of_the_same_request_keeps_instance_config_as_sent() -> None:
    request = with_instance_config(b'{"task" : "keep"}')
    assert b'"instance_config":{"task" : "keep"},' in scored_row(request, 1.0, None)


def test_a_masked_row_posted_back_is_the_same_request() -> None:
    request = with_instance_config(b'{"task": "keep"}')
    again = parse(masked_row(request, "boom"))
    assert response_bytes(again) == RESPONSE
    assert (again.group_id, again.attempt, again.rollout_index) == ("g", 1, 1)


def test_failure_text_is_bounded_to_2000_code_points() -> None:
    request = parse(full_request())
    row = masked_row(request, "é" * 2500)
    assert as_dict(row)["failure_reason"] == "é" * 2000
    assert as_dict(masked_row(request, "short"))["failure_reason"] == "short"


def test_the_legacy_suffix_is_never_cut() -> None:
    key = "prompt_id::" + "p" * 1500 + "::" + "d" * 64 + "::group_attempt::0"
    text = (
        f"GenRM cohort '{key}' failed: every rollout was masked (2 of 2 comparisons failed); "
        "first failure: GenRM judge request failed for pair=(0, 1): HTTP 500: " + "e" * 300
    )
    assert len(text) + len(MIGRATION_SUFFIX) > 2000
    bounded = bound_failure_text(text, MIGRATION_SUFFIX)
    assert len(bounded) == 2000
    assert bounded.endswith(MIGRATION_SUFFIX)
    assert bounded.startswith(text[:100])
    row_text = as_dict(masked_row(parse(full_request()), bounded))["failure_reason"]
    assert row_text == bounded
    assert bound_failure_text("short", MIGRATION_SUFFIX) == "short" + MIGRATION_SUFFIX
    assert bound_failure_text("x" * 2001) == "x" * 2000


def test_failure_texts_with_any_code_points_make_valid_json() -> None:
    text = "GenRM cohort 'group_id::\ud800é\"\n::group_attempt::0' failed"
    row = masked_row(parse(full_request()), text)
    assert as_dict(row)["failure_reason"] == text


# --- small replies (W-3, W-50) ------------------------------------------------------------------


def test_error_bodies_are_a_single_detail_string() -> None:
    assert error_body("duplicate key 'x'") == b'{"detail":"duplicate key \'x\'"}'
    assert json.loads(error_body("GenRM group 'é' \"q\"")) == {"detail": "GenRM group 'é' \"q\""}
    assert json.loads(error_body("GenRM group '\ud800'")) == {"detail": "GenRM group '\ud800'"}


def test_healthz_reports_status_and_the_counts() -> None:
    counts = {
        "judge_in_flight": 4,
        "watermarks": 3,
        "retained_records": 2,
        "active_groups": 1,
        "legacy_resends_collecting": 5,
        "judge_attempts_total": 6,
        "body_bytes_receiving": 7,
        "body_bytes_in_memory": 8,
        "body_bytes_spooled": 9,
    }
    assert render_healthz("ok", counts) == (
        b'{"status":"ok","active_groups":1,"retained_records":2,"watermarks":3,"judge_in_flight":4,'
        b'"legacy_resends_collecting":5,"judge_attempts_total":6,"group_store":"memory",'
        b'"group_store_available":true,"body_bytes_receiving":7,"body_bytes_in_memory":8,'
        b'"body_bytes_spooled":9,"num_rollouts_per_prompt":null,"comparison_strategy":"circular",'
        b'"judge_replicas":[]}'
    )
    replica = JudgeReplicaState(
        url="http://127.0.0.1:9/v1",
        reachable=False,
        last_probe_at=1700000000.5,
        last_error="ConnectError: cannot connect to 127.0.0.1:9: Connection refused",
    )
    grouped = render_healthz(
        "ok",
        counts,
        num_rollouts_per_prompt=8,
        comparison_strategy="all_pairs",
        judge_replicas=[replica],
    )
    assert grouped.endswith(
        b'"body_bytes_spooled":9,"num_rollouts_per_prompt":8,"comparison_strategy":"all_pairs",'
        b'"judge_replicas":[{"url":"http://127.0.0.1:9/v1","reachable":false,'
        b'"last_probe_at":1700000000.5,"last_error":"ConnectError: cannot connect to '
        b'127.0.0.1:9: Connection refused"}]}'
    )
    shared = render_healthz("ok", counts, ("redis://10.0.0.2:6379/0", False))
    assert b'"group_store":"redis://10.0.0.2:6379/0","group_store_available":false,' in shared
    shutting = msgspec.json.decode(render_healthz("shutting_down", counts), type=Healthz)
    assert shutting.status == "shutting_down"
    with pytest.raises(ValueError):
        render_healthz("fine", counts)


def test_readyz_names_reasons_only_when_not_ready() -> None:
    unknown = JudgeReplicaState(
        url="http://judge:8000/v1", reachable=None, last_probe_at=None, last_error=None
    )
    assert render_readyz("ready", ["ignored"], [unknown], True) == (
        b'{"status":"ready","judge_replicas":[{"url":"http://judge:8000/v1","reachable":null,'
        b'"last_probe_at":null,"last_error":null}],"group_store_available":true}'
    )
    assert render_readyz("not_ready", ["group store redis://s:6379/0 unavailable"], [], False) == (
        b'{"status":"not_ready","reasons":["group store redis://s:6379/0 unavailable"],'
        b'"judge_replicas":[],"group_store_available":false}'
    )
    shutting = msgspec.json.decode(render_readyz("shutting_down", ["x"], [], True), type=Readyz)
    assert (shutting.status, shutting.reasons) == ("shutting_down", ["x"])
    with pytest.raises(ValueError):
        render_readyz("fine", [], [], True)


def test_a_masked_row_names_principle_and_prompt_id_as_gyms_failure_rows_do() -> None:
    # Gym's failure rows are its whole verify request dumped, so principle and prompt_id are
    # there (null) even when the request left them out; scored rows do not carry them.
    request = parse(full_request())
    masked = as_dict(masked_row(request, "boom"))
    assert (masked["principle"], masked["prompt_id"]) == (None, None)
    names = keys(masked_row(request, "boom"))
    assert names.index("_ng_task_index") < names.index("principle") < names.index("prompt_id")
    assert names.index("prompt_id") < names.index("reward")
    scored = as_dict(scored_row(request, 1.0, METRICS))
    assert "principle" not in scored and "prompt_id" not in scored


def test_a_masked_row_keeps_a_principle_and_prompt_id_that_were_sent() -> None:
    text = full_request()[:-1] + b', "principle": "Be brief", "prompt_id": null}'
    row = masked_row(parse(text), "boom")
    assert keys(row).count("principle") == 1 and keys(row).count("prompt_id") == 1
    assert (as_dict(row)["principle"], as_dict(row)["prompt_id"]) == ("Be brief", None)
