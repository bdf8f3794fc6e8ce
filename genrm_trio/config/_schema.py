"""The configuration's schema: the Config struct, its key types and the defaults."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from genrm_trio.core.chat_markup import DEFAULT_STRIP_TOKENS

DEFAULT_PRINCIPLE = (
    "You are an impartial judge comparing two assistant responses to the conversation above. "
    "Before judging, write your own answer to the user's last message. Then check both responses "
    "against it, and point out and correct any mistakes or inaccurate statements. Decide how "
    "helpful each response is: it should answer the request or follow the instructions, and when "
    "the request is ambiguous or open to several readings, asking the user to clarify is better "
    "than guessing. Decide how relevant each response is: every part should relate to what was "
    "asked. Decide how concise each response is: clear and to the point, without padding or "
    "needless length. Where it matters, weigh creativity and novelty. Note any important "
    "information that is missing from either response and would help the user."
)

SAMPLING_KEY = "genrm_responses_create_params"


def default_sampling() -> dict[str, Any]:
    return {"max_output_tokens": 16384, "temperature": 0.6, "top_p": 0.95}


JudgeApi = Literal["chat_completions", "responses"]
Strategy = Literal["circular", "all_pairs", "fixed_baseline"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
LogFormat = Literal["text", "json"]
JudgeBalance = Literal["affinity", "least_outstanding"]
MaskedRewardPlaceholder = Literal["zero", "group_mean"]
AppendFsync = Literal["everysec", "always"]


class Config(msgspec.Struct, frozen=True, kw_only=True):
    """The effective configuration; field names are the configuration keys."""

    judge_base_url: str
    judge_model: str
    host: str = "127.0.0.1"
    port: int = 8000
    listen_backlog: int = 4096
    judge_api: JudgeApi = "chat_completions"
    judge_api_key: str | None = None
    # With a shared group store, the budget of every process of the deployment together.
    judge_max_concurrency: int = 256
    judge_process_max_concurrency: int | None = None  # one process's own cap under it
    # Several judge replicas; None: judge_base_url alone. judge_base_url is then the first.
    judge_base_urls: tuple[str, ...] | None = None
    judge_balance: JudgeBalance = "affinity"
    judge_replica_max_concurrency: int | None = None
    judge_replica_eject_after: int = 3
    judge_replica_cooldown_s: float = 10.0
    judge_request_timeout_s: float = 1800.0
    judge_retry_max_sleep_s: float = 8.0
    # Readiness: `GET <replica base URL><judge_probe_path>` per replica at start and then every
    # interval (/readyz, /healthz, `serve --wait-for-judge`); None turns probing off.
    judge_probe_path: str | None = "/models"
    judge_probe_interval_s: float = 10.0
    judge_probe_timeout_s: float = 5.0
    genrm_parse_retries: int = 3
    genrm_parse_retry_sleep_s: float = 0.2
    genrm_responses_create_params: dict[str, Any] = msgspec.field(default_factory=default_sampling)
    compare_timeout_s: float | None = None
    num_rollouts_per_prompt: int = 16
    cohort_collection_timeout_s: float = 1800.0
    cohort_evaluation_timeout_s: float = 1800.0
    cohort_result_ttl_s: float | None = 3600.0
    max_terminal_cohorts: int = 4096
    comparison_strategy: Strategy = "circular"
    num_judges_per_comparison: int = 1
    use_principle: bool = False
    default_principle: str = DEFAULT_PRINCIPLE
    # Chat-template markup the OpenRLHF route takes out of prompts and responses before the
    # judge reads them (core.chat_markup); an empty list passes them as decoded.
    judge_input_strip_tokens: tuple[str, ...] = DEFAULT_STRIP_TOKENS
    aggregator_method: Literal["simple_tiebreaker"] = "simple_tiebreaker"
    reasoning_bonus: float = 0.0
    answer_bonus: float = 0.0
    top_percentile: float = 0.2
    group_reasoning_length_penalty_coeff: float = 0.0
    group_answer_length_penalty_coeff: float = 0.0
    group_style_penalty_coeff: float = 0.0
    default_score: float = 3.0
    default_ranking: float = 3.5
    # What a masked row's `reward` holds (W-33): 0.0, or the mean of its group's scored rewards
    # so that a trainer counting the row in its group mean is not moved by it.
    masked_reward_placeholder: MaskedRewardPlaceholder = "zero"
    # `/openrlhf/get_reward` answers 503 instead of placeholders when every sample of a request
    # was masked because the judge could not be reached: OpenRLHF then stops the step.
    openrlhf_fail_on_transport_mask: bool = True
    max_body_bytes: int = 67108864
    # Bodies of requests in flight kept in memory; beyond it they wait in files in spool_dir
    # (None: no budget, every body stays in memory).
    waiting_body_memory_bytes: int | None = 1073741824
    spool_dir: str | None = None  # None: a private temporary directory removed at exit
    max_compare_responses: int = 1024
    shutdown_grace_s: float = 5.0
    log_level: LogLevel = "INFO"
    log_format: LogFormat = "text"
    debug_logging: bool = False
    # The masked share of /verify rollouts over this many seconds (the /metrics gauge), and the
    # share at which it is logged as a WARNING once the window holds enough rollouts (None: never).
    mask_window_s: float = 60.0
    mask_warning_ratio: float | None = 0.5
    mask_warning_min_rollouts: int = 16
    early_judging: bool = False
    # Where groups live: this process's memory, or a Redis/Valkey URL shared by several
    # processes. The password may come from the URL or GENRM_GROUP_STORE_PASSWORD.
    group_store: str = "memory"
    group_store_key_prefix: str = "genrm:"  # lets several deployments share one database
    group_store_lease_s: float = 30.0  # an evaluation owner's lease, renewed every third
    group_store_poll_s: float = 1.0  # sweeps: deadlines, expired leases, missed wake-ups
    # Worker processes of `serve`; with more than one and `group_store: memory`, the parent
    # starts a Redis/Valkey server of its own for them, whose append-only file syncs this way.
    workers: int = 1
    embedded_store_appendfsync: AppendFsync = "everysec"

    @property
    def group_mode(self) -> bool:
        """W-11: groups are gathered when N > 1 or under fixed_baseline."""
        return self.num_rollouts_per_prompt > 1 or self.comparison_strategy == "fixed_baseline"

    @property
    def attempts_per_comparison(self) -> int:
        return self.genrm_parse_retries + 1

    @property
    def process_judge_concurrency(self) -> int:
        """Judge attempts one process may have in flight (J-33)."""
        own = self.judge_process_max_concurrency
        return self.judge_max_concurrency if own is None else min(own, self.judge_max_concurrency)
