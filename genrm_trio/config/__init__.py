"""Typed server configuration: the schema, its checks, and loading from YAML and ``--set``.

Every name other modules use is re-exported here, so `from genrm_trio.config import X` works.
"""

from genrm_trio.config._checks import (
    CONFIG_KEYS,
    REQUIRED_KEYS,
    SERVER_OWNED_SAMPLING_KEYS,
    ConfigError,
    config_from_mapping,
    url_without_userinfo,
)
from genrm_trio.config._loading import (
    API_KEY_ENV,
    config_warnings,
    format_seconds,
    load_config,
    parse_yaml,
    public_view,
    read_config_file,
    resolve_api_key,
)
from genrm_trio.config._schema import (
    DEFAULT_PRINCIPLE,
    SAMPLING_KEY,
    Config,
    JudgeApi,
    LogLevel,
    MaskedRewardPlaceholder,
    Strategy,
)

__all__ = [
    "API_KEY_ENV",
    "CONFIG_KEYS",
    "DEFAULT_PRINCIPLE",
    "REQUIRED_KEYS",
    "SAMPLING_KEY",
    "SERVER_OWNED_SAMPLING_KEYS",
    "Config",
    "ConfigError",
    "JudgeApi",
    "LogLevel",
    "MaskedRewardPlaceholder",
    "Strategy",
    "config_from_mapping",
    "config_warnings",
    "format_seconds",
    "load_config",
    "parse_yaml",
    "public_view",
    "read_config_file",
    "resolve_api_key",
    "url_without_userinfo",
]
