"""NeMo Gym config files as genrm-trio configuration: Gym's shipped genrm_compare config as it is,
its nesting, its own keys set aside, and genrm_model_server mapped or explained."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from genrm_trio.config import DEFAULT_PRINCIPLE, ConfigError, load_config
from genrm_trio.gym_config import config_from_gym, load_serve_config, translate

DATA = Path(__file__).parent / "data"
GYM_SHIPPED = DATA / "gym_genrm_compare.yaml"
GYM_RELEASED = DATA / "gym_0.7.0_genrm_compare.yaml"
OURS = Path(__file__).parent.parent / "resources_servers" / "genrm_trio" / "configs"
JUDGE = ["judge_base_url=http://judge:8000/v1", "judge_model=genrm"]


def gym_document() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(GYM_SHIPPED.read_text(encoding="utf-8"))
    return document


def test_gyms_shipped_config_names_the_keys_to_set_instead_of_its_model_server() -> None:
    with pytest.raises(ConfigError) as caught:
        load_serve_config(GYM_SHIPPED)
    assert caught.value.lines == [
        "invalid configuration: genrm_model_server: names NeMo Gym's model server "
        "'genrm_model', whose address only Gym's runner and head server know; outside a Gym "
        "run set judge_base_url (the judge's OpenAI-compatible base URL, e.g. "
        "http://judge-host:8000/v1) and judge_model instead, with --set or in the block "
        "(judge_api: responses if the judge is a NeMo Gym model server)"
    ]


def test_gyms_shipped_config_loads_unchanged_with_the_judge_set() -> None:
    config, notes = load_serve_config(GYM_SHIPPED, JUDGE)
    assert (config.judge_base_url, config.judge_model) == ("http://judge:8000/v1", "genrm")
    # Every scoring key of Gym's block is taken as written there.
    assert config.num_rollouts_per_prompt == 16
    assert config.comparison_strategy == "circular"
    assert config.genrm_parse_retries == 3 and config.genrm_parse_retry_sleep_s == 0.2
    assert config.genrm_responses_create_params["max_output_tokens"] == 16384
    assert config.top_percentile == 0.2 and config.default_ranking == 3.5
    # Keys the block leaves out keep genrm-trio's defaults, not Gym's.
    assert config.judge_api == "chat_completions"
    assert config.default_principle == DEFAULT_PRINCIPLE
    assert notes == [
        "NeMo Gym config: serving block 'genrm_compare_resources_server' "
        "(resources_servers.genrm_compare); ignored Gym keys description, domain, entrypoint, "
        "value, verified; genrm_model_server 'genrm_model' not used (judge_base_url and "
        "judge_model are set); other servers of the run left to Gym: genrm_model, "
        "genrm_simple_agent, genrm_simple_agent_reasoning_off"
    ]


def test_the_config_of_gyms_0_7_0_release_loads_unchanged_with_the_judge_set() -> None:
    with pytest.raises(ConfigError, match=r"^invalid configuration: genrm_model_server: names"):
        load_serve_config(GYM_RELEASED)
    config, notes = load_serve_config(GYM_RELEASED, JUDGE)
    # The release adds the deadlines and retention keys, under the same names as genrm-trio's.
    assert config.cohort_collection_timeout_s == config.cohort_evaluation_timeout_s == 1800.0
    assert (config.judge_request_timeout_s, config.cohort_result_ttl_s) == (1800.0, 21600.0)
    assert config.max_terminal_cohorts == 4096 and config.num_rollouts_per_prompt == 16
    assert notes[0].endswith(
        "other servers of the run left to Gym: genrm_model, genrm_simple_agent, "
        "genrm_simple_agent_reasoning_off, genrm_environment_server, "
        "genrm_simple_agent_reasoning_off_environment_server"
    )


def test_a_model_server_with_an_address_becomes_the_judge() -> None:
    document = gym_document()
    model = document["genrm_model"]["responses_api_models"]["genrm_model"]
    model.update(host="10.1.2.3", port=12001)
    document["genrm_model_name"] = "nvidia/GenRM"
    config, translation = config_from_gym(document)
    assert config.judge_base_url == "http://10.1.2.3:12001/v1"
    assert config.judge_api == "responses"
    assert config.judge_model == "nvidia/GenRM"  # Gym's ${genrm_model_name}, resolved
    assert translation.model_server_resolved
    assert "judge from genrm_model_server 'genrm_model'" in translation.note()


def test_keys_set_in_the_block_win_over_the_model_server() -> None:
    document = gym_document()
    document["genrm_model"]["responses_api_models"]["genrm_model"].update(host="h", port=1)
    block = document["genrm_compare_resources_server"]["resources_servers"]["genrm_compare"]
    block["judge_api"] = "chat_completions"
    config, _ = config_from_gym(document)
    assert (config.judge_base_url, config.judge_api) == ("http://h:1/v1", "chat_completions")


def test_a_misspelt_key_in_a_gym_block_is_still_an_error() -> None:
    document = gym_document()
    block = document["genrm_compare_resources_server"]["resources_servers"]["genrm_compare"]
    block["num_rollout_per_prompt"] = 8
    with pytest.raises(ConfigError) as caught:
        config_from_gym(document, sets=JUDGE)
    assert caught.value.lines == [
        "unknown configuration key 'num_rollout_per_prompt' "
        "(did you mean 'num_rollouts_per_prompt'?)"
    ]


def test_set_and_port_override_the_gym_block() -> None:
    config, _ = load_serve_config(
        GYM_SHIPPED, [*JUDGE, "num_rollouts_per_prompt=4"], host="0.0.0.0", port=0
    )
    assert (config.num_rollouts_per_prompt, config.host, config.port) == (4, "0.0.0.0", 0)


def test_a_plain_genrm_trio_file_loads_as_before(tmp_path: Path) -> None:
    path = tmp_path / "plain.yaml"
    path.write_text("judge_base_url: http://j/v1\njudge_model: m\nport: 9\n", encoding="utf-8")
    config, notes = load_serve_config(path, ["num_rollouts_per_prompt=2"])
    assert config == load_config(path, ["num_rollouts_per_prompt=2"]) and notes == []


def test_several_resources_servers_prefer_the_one_genrm_block() -> None:
    document = gym_document()
    document["math"] = {"resources_servers": {"math_with_judge": {"entrypoint": "app.py"}}}
    assert translate(document).instance == "genrm_compare_resources_server"
    document["other_genrm"] = {"resources_servers": {"genrm_compare": {"entrypoint": "app.py"}}}
    with pytest.raises(ConfigError, match="cannot tell which resources server to serve"):
        translate(document)
    assert translate(document, "other_genrm").instance == "other_genrm"


def test_gym_references_resolve_or_name_the_key_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    document = yaml.safe_load((OURS / "genrm_trio.yaml").read_text(encoding="utf-8"))
    with pytest.raises(ConfigError) as caught:
        config_from_gym(document)
    assert caught.value.lines == [
        "invalid configuration: genrm_trio_resources_server.resources_servers.genrm_trio."
        "judge_base_url: NeMo Gym reference ${genrm_judge_base_url} is not set in this file; "
        "set judge_base_url directly or define genrm_judge_base_url"
    ]
    monkeypatch.setenv("JUDGE_URL", "http://judge:9000/v1")
    document["genrm_judge_base_url"] = "${oc.env:JUDGE_URL}"
    document["genrm_judge_model"] = "qwen-genrm"
    config, translation = config_from_gym(document)
    assert (config.judge_base_url, config.judge_model) == ("http://judge:9000/v1", "qwen-genrm")
    assert config.judge_request_timeout_s == 600.0 and config.num_rollouts_per_prompt == 16
    assert translation.ignored == ["entrypoint", "domain", "description"]
    assert translation.other_blocks == ["genrm_trio_simple_agent", "genrm_trio_environment_server"]


def test_every_agent_of_the_shipped_config_is_fronted_by_an_environment_server() -> None:
    # Gym 0.7.0 reaches an agent only through an environment server: an agent without one gets
    # a generated `legacy_agent` server and a deprecation warning, and a future release rejects
    # the config (AgentWithoutEnvironmentServerError).
    document = yaml.safe_load((OURS / "genrm_trio.yaml").read_text(encoding="utf-8"))
    agents = {name for name, block in document.items() if "responses_api_agents" in block}
    fronted = {
        block["environment_servers"]["legacy_agent"]["agent_server"]["name"]
        for block in document.values()
        if "environment_servers" in block
    }
    assert agents == {"genrm_trio_simple_agent"} and fronted == agents
    for block in document.values():
        if "environment_servers" in block:
            server = block["environment_servers"]["legacy_agent"]
            assert server["entrypoint"] == "app.py"
            assert server["agent_server"]["type"] == "responses_api_agents"
