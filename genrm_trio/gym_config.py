"""NeMo Gym resources-server configuration read as genrm-trio configuration.

A Gym config file nests each server under its instance name and type,
``<name>: resources_servers: <server type>: {...}``, next to the blocks of the other servers of
a run. The genrm_compare block shares its scoring keys with genrm-trio; what Gym's runner and
catalogue read (``entrypoint``, ``domain``, ``description``, ...) is ignored and named in one log
line; ``genrm_model_server`` points at another server of the run and becomes the judge address
when that server's host and port are known (always under Gym's runner, which assigns them before
it starts any server; in a file on its own only when the file sets them).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from genrm_trio.config import Config, ConfigError, load_config, read_config_file

RESOURCES_SERVERS = "resources_servers"
MODEL_SERVERS = "responses_api_models"
MODEL_SERVER_REF = "genrm_model_server"
SERVER_KINDS = frozenset(
    {RESOURCES_SERVERS, MODEL_SERVERS, "responses_api_agents", "environment_servers"}
)
# Read by Gym's runner, head server or environment catalogue, never by the reward server.
GYM_RUNNER_KEYS = frozenset(
    {
        "entrypoint",
        "name",
        "domain",
        "datasets",
        "expose_tools_over_mcp",
        "description",
        "verified",
        "verified_url",
        "value",
    }
)
# Server types whose block holds genrm-trio keys, in order of preference when a file has several
# resources servers.
SCORING_SERVER_TYPES = ("genrm_trio", "genrm_compare")

_INTERPOLATION = re.compile(r"\$\{([^${}]+)\}")


@dataclass
class GymTranslation:
    """genrm-trio keys taken from one Gym resources-server block."""

    instance: str  # the block's top-level name, as Gym's agents refer to the server
    server_type: str
    values: dict[str, Any]
    ignored: list[str] = field(default_factory=list)
    other_blocks: list[str] = field(default_factory=list)
    model_server: str | None = None  # the genrm_model_server name, if any
    model_server_resolved: bool = False

    def note(self) -> str:
        """The one log line that names what was ignored and where the judge comes from."""
        parts = [
            f"NeMo Gym config: serving block '{self.instance}' "
            f"({RESOURCES_SERVERS}.{self.server_type})"
        ]
        if self.ignored:
            parts.append("ignored Gym keys " + ", ".join(sorted(self.ignored)))
        if self.model_server is not None:
            if self.model_server_resolved:
                parts.append(f"judge from {MODEL_SERVER_REF} '{self.model_server}'")
            else:
                parts.append(
                    f"{MODEL_SERVER_REF} '{self.model_server}' not used "
                    "(judge_base_url and judge_model are set)"
                )
        if self.other_blocks:
            parts.append("other servers of the run left to Gym: " + ", ".join(self.other_blocks))
        return "; ".join(parts)


def is_gym_document(document: Mapping[Any, Any]) -> bool:
    """Whether ``document`` is nested the Gym way (some block holds ``resources_servers``)."""
    return any(
        isinstance(value, Mapping) and isinstance(value.get(RESOURCES_SERVERS), Mapping)
        for value in document.values()
    )


def _server_blocks(document: Mapping[Any, Any], kind: str) -> list[tuple[str, str, Any]]:
    found = []
    for instance, value in document.items():
        if not isinstance(value, Mapping):
            continue
        typed = value.get(kind)
        if isinstance(typed, Mapping) and len(typed) == 1:
            (server_type, block), *_ = typed.items()
            found.append((str(instance), str(server_type), block))
    return found


def _choose(document: Mapping[Any, Any], instance: str | None) -> tuple[str, str, Any]:
    blocks = _server_blocks(document, RESOURCES_SERVERS)
    if instance is not None:
        chosen = [b for b in blocks if b[0] == instance]
        if not chosen:
            raise ConfigError(
                f"invalid configuration: NeMo Gym config has no {RESOURCES_SERVERS} block named "
                f"'{instance}'"
            )
        return chosen[0]
    if len(blocks) == 1:
        return blocks[0]
    for server_type in SCORING_SERVER_TYPES:
        of_type = [b for b in blocks if b[1] == server_type]
        if len(of_type) == 1:
            return of_type[0]
    names = ", ".join(f"'{b[0]}'" for b in blocks) or "none"
    raise ConfigError(
        "invalid configuration: NeMo Gym config: cannot tell which resources server to serve "
        f"(found {names}); keep one genrm_compare block in the file"
    )


def _lookup(document: Mapping[Any, Any], dotted: str) -> Any:
    node: Any = document
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def _resolve(value: Any, document: Mapping[Any, Any], path: str, depth: int = 0) -> Any:
    """OmegaConf-style ``${key.path}`` and ``${oc.env:VAR[,default]}`` references, as Gym
    resolves them; anything else is reported with the key to set instead."""
    if isinstance(value, Mapping):
        return {k: _resolve(v, document, f"{path}.{k}", depth) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, document, f"{path}[{i}]", depth) for i, v in enumerate(value)]
    if not isinstance(value, str) or "${" not in value:
        return value
    if depth > 16:
        raise ConfigError(f"invalid configuration: {path}: interpolation loops ({value})")

    def one(reference: str) -> Any:
        if reference.startswith("oc.env:"):
            name, _, default = reference.removeprefix("oc.env:").partition(",")
            found = os.environ.get(name.strip())
            if found is not None:
                return found
            if default:
                return default.strip().strip("'\"")
            raise ConfigError(
                f"invalid configuration: {path}: environment variable {name.strip()} is not set "
                f"(from ${{{reference}}})"
            )
        try:
            return _resolve(_lookup(document, reference), document, path, depth + 1)
        except KeyError:
            raise ConfigError(
                f"invalid configuration: {path}: NeMo Gym reference ${{{reference}}} is not set "
                f"in this file; set {path.rsplit('.', 1)[-1]} directly or define {reference}"
            ) from None

    whole = _INTERPOLATION.fullmatch(value)
    if whole is not None:
        return one(whole.group(1))
    return _INTERPOLATION.sub(lambda match: str(one(match.group(1))), value)


def _model_server_address(
    document: Mapping[Any, Any], reference: Any, path: str
) -> tuple[str, str | None, str | None]:
    """(name, base URL or None, model or None) of the model server a block points at."""
    if not isinstance(reference, Mapping) or not isinstance(reference.get("name"), str):
        raise ConfigError(
            f"invalid configuration: {path}: expected a NeMo Gym server reference "
            "{type: responses_api_models, name: <server>}; or remove it and set judge_base_url "
            "and judge_model"
        )
    name = reference["name"]
    kind = reference.get("type", MODEL_SERVERS)
    if kind != MODEL_SERVERS:
        raise ConfigError(
            f"invalid configuration: {path}.type: must be {MODEL_SERVERS} (got '{kind}')"
        )
    target = document.get(name)
    inner = target.get(MODEL_SERVERS) if isinstance(target, Mapping) else None
    if not isinstance(inner, Mapping) or len(inner) != 1:
        return name, None, None
    (_, block), *_ = inner.items()
    if not isinstance(block, Mapping):
        return name, None, None

    def setting(key: str) -> Any:
        # The model server's own settings may refer to values only Gym's command line sets
        # (its model name, say); an unresolvable one just leaves the address unknown.
        try:
            return _resolve(block.get(key), document, f"{name}.{key}")
        except ConfigError:
            return None

    host, port, model = setting("host"), setting("port"), setting("model")
    if not isinstance(model, str) or not model:
        model = None
    if not isinstance(host, str) or not host or isinstance(port, bool) or not isinstance(port, int):
        return name, None, model
    if port <= 0:
        return name, None, model
    return name, f"http://{host}:{port}/v1", model


def translate(document: Mapping[Any, Any], instance: str | None = None) -> GymTranslation:
    """The genrm-trio keys of the Gym resources-server block ``instance`` (or the file's one
    genrm_compare block), with Gym's own keys set aside and the judge taken from
    ``genrm_model_server`` when its address is in ``document``."""
    name, server_type, block = _choose(document, instance)
    if not isinstance(block, Mapping):
        raise ConfigError(
            f"invalid configuration: {name}.{RESOURCES_SERVERS}.{server_type}: expected a mapping"
        )
    translation = GymTranslation(instance=name, server_type=server_type, values={})
    translation.other_blocks = [
        str(key)
        for key, value in document.items()
        if key != name
        and isinstance(value, Mapping)
        and len(value) == 1
        and next(iter(value)) in SERVER_KINDS
    ]
    for key, value in block.items():
        path = f"{name}.{RESOURCES_SERVERS}.{server_type}.{key}"
        if key in GYM_RUNNER_KEYS:
            translation.ignored.append(str(key))
        elif key == "num_workers":
            # Gym's uvicorn workers; here they share their groups through the group store.
            translation.values["workers"] = _resolve(value, document, path)
        elif key == MODEL_SERVER_REF:
            model_server, base_url, model = _model_server_address(document, value, path)
            translation.model_server = model_server
            if base_url is not None:
                translation.model_server_resolved = True
                # Gym's model servers speak the Responses API with the pair in `metadata` (J-3)
                # and put their own model name on every call.
                translation.values.setdefault("judge_base_url", base_url)
                translation.values.setdefault("judge_api", "responses")
                translation.values.setdefault("judge_model", model or model_server)
        else:
            translation.values[key] = _resolve(value, document, path)
    return translation


def _unresolved_lines(lines: Sequence[str], translation: GymTranslation) -> list[str]:
    """CF-4 lines with "judge_* required" replaced by what to set instead of the reference."""
    missing = {
        "invalid configuration: judge_base_url: required",
        "invalid configuration: judge_model: required",
    }
    if translation.model_server is None or translation.model_server_resolved:
        return list(lines)
    kept = [line for line in lines if line not in missing]
    if len(kept) == len(lines):
        return list(lines)
    kept.append(
        f"invalid configuration: {MODEL_SERVER_REF}: names NeMo Gym's model server "
        f"'{translation.model_server}', whose address only Gym's runner and head server know; "
        "outside a Gym run set judge_base_url (the judge's OpenAI-compatible base URL, e.g. "
        "http://judge-host:8000/v1) and judge_model instead, with --set or in the block "
        "(judge_api: responses if the judge is a NeMo Gym model server)"
    )
    return kept


def config_from_gym(
    document: Mapping[Any, Any],
    instance: str | None = None,
    sets: Sequence[str] = (),
    *,
    host: str | None = None,
    port: int | None = None,
) -> tuple[Config, GymTranslation]:
    """Validate the Gym block's genrm-trio keys, then ``sets`` and host/port over them."""
    translation = translate(document, instance)
    try:
        config = load_config(None, sets, host=host, port=port, base=translation.values)
    except ConfigError as exc:
        raise ConfigError(_unresolved_lines(exc.lines, translation)) from None
    return config, translation


def load_serve_config(
    path: str | os.PathLike[str] | None,
    sets: Sequence[str] = (),
    *,
    host: str | None = None,
    port: int | None = None,
) -> tuple[Config, list[str]]:
    """`serve`'s configuration from a genrm-trio file or a NeMo Gym config file as it is; the
    lines to log once logging is set up come second."""
    if path is None:
        return load_config(None, sets, host=host, port=port), []
    document = read_config_file(path)
    if not is_gym_document(document):
        return load_config(None, sets, host=host, port=port, base=document), []
    config, translation = config_from_gym(document, None, sets, host=host, port=port)
    return config, [translation.note()]
