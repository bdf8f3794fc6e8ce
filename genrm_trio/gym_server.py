"""genrm-trio started by NeMo Gym's runner as one of the resources servers of a run.

Gym's runner (`gym env start`, `ng_run`) starts each server as `python <entrypoint>` in the
server's directory, after it has merged every config of the run and given each server a host
and port. It passes that merged config as YAML in `NEMO_GYM_CONFIG_DICT` and the server's own
top-level name in `NEMO_GYM_CONFIG_PATH`; Gym's agents then reach the server by that name at the
host and port written there, and wait until it answers HTTP. This module reads the same two
variables: the block named there is the configuration (host and port included), and its
`genrm_model_server` resolves to the host and port Gym assigned that model server. A run with
Gym's `dry_run` set only checks the configuration.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

import yaml

from genrm_trio.config import Config, ConfigError, parse_yaml
from genrm_trio.gym_config import GymTranslation, config_from_gym
from genrm_trio.serve import run_serve

CONFIG_DICT_ENV = "NEMO_GYM_CONFIG_DICT"
CONFIG_PATH_ENV = "NEMO_GYM_CONFIG_PATH"
DRY_RUN_KEY = "dry_run"


def config_from_environment(
    environ: Mapping[str, str],
) -> tuple[Config, GymTranslation, bool]:
    """(configuration, what was read, whether Gym asked for a dry run) from Gym's variables."""
    text = environ.get(CONFIG_DICT_ENV)
    instance = environ.get(CONFIG_PATH_ENV)
    if not text or not instance:
        raise ConfigError(
            f"genrm-trio gym server: {CONFIG_DICT_ENV} and {CONFIG_PATH_ENV} must be set; NeMo "
            "Gym's runner sets both when it starts a server (outside Gym, use "
            "`genrm-trio serve --config FILE`)"
        )
    try:
        document: Any = parse_yaml(text)
    except (yaml.YAMLError, ValueError) as exc:
        raise ConfigError(f"genrm-trio gym server: {CONFIG_DICT_ENV} is not YAML: {exc}") from None
    if not isinstance(document, Mapping):
        raise ConfigError(f"genrm-trio gym server: {CONFIG_DICT_ENV} is not a mapping")
    config, translation = config_from_gym(document, instance)
    return config, translation, document.get(DRY_RUN_KEY) is True


def main(environ: Mapping[str, str] | None = None) -> int:
    """Serve as the resources server Gym's runner started; the process exit status."""
    try:
        config, translation, dry_run = config_from_environment(
            os.environ if environ is None else environ
        )
    except ConfigError as exc:
        for line in exc.lines:
            print(line, file=sys.stderr)
        return 2
    if dry_run:
        print(f"genrm-trio gym server: configuration of '{translation.instance}' is valid")
        return 0
    return run_serve(config, [translation.note()])


if __name__ == "__main__":
    sys.exit(main())
