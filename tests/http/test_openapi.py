"""The OpenAPI document: routes, status codes and schemas generated from the wire types
(W-51, AS-165)."""

from __future__ import annotations

import json
from typing import Any

from genrm_trio.http._openapi import openapi_document, openapi_json

SCHEMA_PREFIX = "#/components/schemas/"


def refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [ref for value in node.values() for ref in refs(value)]
    if isinstance(node, list):
        return [ref for value in node for ref in refs(value)]
    return []


def schema(document: dict[str, Any], ref: str) -> dict[str, Any]:
    assert ref.startswith(SCHEMA_PREFIX)
    found: dict[str, Any] = document["components"]["schemas"][ref.removeprefix(SCHEMA_PREFIX)]
    return found


def test_every_route_and_status_code_is_documented() -> None:
    document = openapi_document("1.2.3")
    assert document["openapi"] == "3.1.0"
    assert document["info"]["version"] == "1.2.3"
    paths = document["paths"]
    assert set(paths) == {
        "/verify",
        "/verify_group",
        "/openrlhf/get_reward",
        "/compare",
        "/seed_session",
        "/close_session",
        "/reverify_mode",
        "/aggregate_metrics",
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
    }
    assert set(paths["/verify"]["post"]["responses"]) == {"200", "400", "409", "413", "422", "503"}
    assert {"200", "400", "413", "422", "503"} <= set(paths["/compare"]["post"]["responses"])
    assert set(paths["/healthz"]["get"]["responses"]) == {"200", "503"}
    assert set(paths["/readyz"]["get"]["responses"]) == {"200", "503"}
    assert set(paths["/seed_session"]["post"]["responses"]) == {"200", "400", "413", "422"}
    assert set(paths["/close_session"]["post"]["responses"]) == {"200", "400", "413", "422"}
    assert set(paths["/reverify_mode"]["get"]["responses"]) == {"200"}
    assert set(paths["/aggregate_metrics"]["post"]["responses"]) == {"200", "400", "413", "422"}


def test_gym_routes_document_gyms_shapes() -> None:
    document = openapi_document("1")
    operation = document["paths"]["/aggregate_metrics"]["post"]
    content = operation["requestBody"]["content"]["application/json"]["schema"]
    assert schema(document, content["$ref"])["required"] == ["verify_responses"]
    reply = operation["responses"]["200"]["content"]["application/json"]["schema"]
    properties = schema(document, reply["$ref"])["properties"]
    assert set(properties) == {
        "group_level_metrics",
        "agent_metrics",
        "key_metrics",
        "perf_summary",
        "repeat_level_metrics",
    }


def test_every_reference_resolves() -> None:
    document = openapi_document("1")
    for ref in refs(document):
        assert schema(document, ref)["type"] == "object"


def test_request_schemas_state_the_field_rules() -> None:
    document = openapi_document("1")
    verify = schema(
        document,
        document["paths"]["/verify"]["post"]["requestBody"]["content"]["application/json"][
            "schema"
        ]["$ref"],
    )
    assert verify["required"] == ["responses_create_params", "response"]
    properties = verify["properties"]
    group_id = properties["_ng_group_id"]["anyOf"][0]
    assert (group_id["minLength"], group_id["maxLength"]) == (1, 1024)
    attempt = properties["_ng_group_attempt"]
    assert (attempt["type"], attempt["minimum"], attempt["maximum"]) == ("integer", 0, 2**63 - 1)
    assert "_ng_rollout_id" in properties and "instance_config" in properties
    response = schema(document, properties["response"]["$ref"])
    assert response["required"] == ["output"]
    assert response["properties"]["output"] == {"type": "array", "items": {"type": "object"}}

    compare = schema(
        document,
        document["paths"]["/compare"]["post"]["requestBody"]["content"]["application/json"][
            "schema"
        ]["$ref"],
    )
    assert compare["required"] == ["conversation_history", "response_objs"]


def test_reply_schemas_match_the_rows_and_replies() -> None:
    document = openapi_document("1")
    verify_ok = document["paths"]["/verify"]["post"]["responses"]["200"]
    row_refs = verify_ok["content"]["application/json"]["schema"]["oneOf"]
    scored, masked = (schema(document, entry["$ref"]) for entry in row_refs)
    assert scored["properties"]["mask_sample"] == {"enum": [False]}
    assert masked["properties"]["mask_sample"] == {"enum": [True]}
    assert masked["properties"]["failure_reason"]["maxLength"] == 2000
    assert "tiebreak_usage_rate" not in scored["required"]
    compare_ok = document["paths"]["/compare"]["post"]["responses"]["200"]
    reply = schema(document, compare_ok["content"]["application/json"]["schema"]["$ref"])
    assert reply["required"] == ["rewards", "comparison_results", "metrics"]
    result = schema(document, "#/components/schemas/ComparisonResult")
    assert list(result["properties"]) == [
        "response_i",
        "response_j",
        "judge_idx",
        "score_1",
        "score_2",
        "ranking",
    ]
    error = document["paths"]["/verify"]["post"]["responses"]["422"]
    assert schema(document, error["content"]["application/json"]["schema"]["$ref"])["required"] == [
        "detail"
    ]
    health = document["paths"]["/healthz"]["get"]["responses"]["503"]
    assert schema(document, health["content"]["application/json"]["schema"]["$ref"])["properties"][
        "status"
    ] == {"enum": ["ok", "shutting_down"]}


def test_the_encoded_document_is_built_once_and_callers_get_fresh_copies() -> None:
    assert openapi_json("9.9") is openapi_json("9.9")
    assert json.loads(openapi_json("9.9")) == openapi_document("9.9")
    first = openapi_document("9.9")
    first["paths"].clear()
    assert openapi_document("9.9")["paths"]
