"""What a race scenario is made of: its steps and judge faults, the /verify body and the
configuration they stand for, and the pairs each comparison strategy judges."""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from genrm_trio.config import Config, config_from_mapping
from genrm_trio.testing.controlled_judge import group_marker
from genrm_trio.testing.harness import SCENARIO_DEFAULTS

# Every time in a scenario is a multiple of TICK, so sums stay exact and ties are real ties.
TICK = 1 / 1024
COLLECTION_TIMEOUT = 5.0
EVALUATION_TIMEOUT = 3.0
CONVERSION_FAULT = "injected conversion fault"
FAULT_KINDS = (
    "unparseable",
    "empty",
    "transient",
    "rate_limited",
    "flaky",
    "fatal",
    "non_json",
    "close",
    "truncated",
    "budget",
    "hang",
)
RELEASE_ACTIONS = (None, "fatal", "transient")
Via = Literal["engine", "http", "shared"]
# Shared mode: two engines on one Redis store. Their store clock is this epoch plus Trio's clock
# (never near Redis's own, so Redis never expires a key by PXAT during a run: retention is the
# store's own trimming and pruning). A lease of more than three evaluation deadlines is never
# renewed before the owner's evaluation deadline ends its evaluation.
ENGINES = 2
STORE_EPOCH = 4_000_000_000.0
LEASE_S = 10.0


@dataclass(frozen=True)
class Post:
    """Post one member; several request ids send identical copies at the same instant."""

    requests: tuple[int, ...]
    group: str
    attempt: int
    slot: int
    quality: int = 3
    variant: int = 0  # 0 is the original answer; any other number a regenerated one
    task: int | None = None  # a legacy group: `_ng_task_index`, no `_ng_group_id`
    other_prompt: bool = False
    conversion_fault: bool = False

    @property
    def marker(self) -> str:
        """The group name the judge sees; another prompt is another legacy group."""
        return self.group + ("~" if self.other_prompt else "")


@dataclass(frozen=True)
class Disconnect:
    request: int


@dataclass(frozen=True)
class Release:
    """Answer the held judge calls of one pair: normally, or with a fault."""

    group: str
    attempt: int
    pair: tuple[int, int]
    action: str | None = None  # None, "fatal" (HTTP 400) or "transient" (HTTP 500)


@dataclass(frozen=True)
class Advance:
    seconds: float


@dataclass(frozen=True)
class Shutdown:
    pass


@dataclass(frozen=True)
class Kill:
    """Shared mode: one engine dies at once (no shutdown) and a fresh one takes its place."""

    engine: int


@dataclass(frozen=True)
class Notify:
    """Shared mode: from now on one engine loses, duplicates or simply receives every outcome
    notification (mode "lost", "duplicated" or "delivered")."""

    engine: int
    mode: str


@dataclass(frozen=True)
class RestartStore:
    """Shared mode: Redis is killed (SIGKILL) and started again on its data (append-only file,
    `appendfsync always`); every connection to it drops."""


@dataclass(frozen=True)
class Burst:
    """Several posts sent at the same instant, each to its own engine, with no pause between
    them, as a trainer posts a step: their transactions race at both engines. The generator
    builds only bursts whose answers do not depend on the order the posts are applied in: fresh
    members of current attempts, one post per slot, and at most one post that fills a group."""

    posts: tuple[Post, ...]


NOTIFY_MODES = ("lost", "duplicated", "delivered")
Step = Post | Burst | Disconnect | Release | Advance | Shutdown | Kill | Notify | RestartStore
_STEP_TYPES: dict[str, type[Any]] = {
    cls.__name__: cls
    for cls in (Post, Burst, Disconnect, Release, Advance, Shutdown, Kill, Notify, RestartStore)
}


def posts_of(steps: Iterable[Step]) -> Iterator[Post]:
    """Every post of `steps`, those inside bursts included."""
    for step in steps:
        if isinstance(step, Post):
            yield step
        elif isinstance(step, Burst):
            yield from step.posts


@dataclass(frozen=True)
class Fault:
    """How the judge treats every pass of one pair of one group attempt."""

    group: str
    attempt: int
    pair: tuple[int, int]
    kind: str  # one of FAULT_KINDS, or "hold"
    times: int | None = None  # "flaky": failures before a verdict


@dataclass(frozen=True)
class Scenario:
    seed: int
    settings: Mapping[str, Any]
    faults: tuple[Fault, ...]
    steps: tuple[Step, ...]

    def to_json(self) -> str:
        steps = [{"step": type(s).__name__, **asdict(s)} for s in self.steps]
        faults = [asdict(f) for f in self.faults]
        payload = {"seed": self.seed, "settings": dict(self.settings), "faults": faults}
        return json.dumps({**payload, "steps": steps}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Scenario:
        data = json.loads(text)
        steps = []
        for raw in data["steps"]:
            kind = _STEP_TYPES[raw.pop("step")]
            if kind is Post:
                raw["requests"] = tuple(raw["requests"])
            if kind is Burst:
                raw["posts"] = tuple(
                    Post(**{**post, "requests": tuple(post["requests"])}) for post in raw["posts"]
                )
            if kind is Release:
                raw["pair"] = tuple(raw["pair"])
            steps.append(kind(**raw))
        faults = tuple(Fault(**{**f, "pair": tuple(f["pair"])}) for f in data["faults"])
        return cls(data["seed"], data["settings"], faults, tuple(steps))


def describe_step(step: Step) -> str:
    if isinstance(step, Post):
        who = f"task {step.task}" if step.task is not None else f"group {step.group!r}"
        extras = [f"q={step.quality}"]
        if step.variant:
            extras.append(f"regenerated#{step.variant}")
        if step.other_prompt:
            extras.append("another prompt")
        if step.conversion_fault:
            extras.append("conversion fault")
        copies = f" x{len(step.requests)}" if len(step.requests) > 1 else ""
        ids = ",".join(str(r) for r in step.requests)
        return (
            f"post r{ids}{copies}: {who} attempt {step.attempt} slot {step.slot} "
            f"({', '.join(extras)})"
        )
    if isinstance(step, Burst):
        return "burst: " + "; ".join(describe_step(post) for post in step.posts)
    if isinstance(step, Disconnect):
        return f"disconnect r{step.request}"
    if isinstance(step, Release):
        how = f" with {step.action}" if step.action else ""
        return f"release {step.group}:{step.attempt} pair {step.pair}{how}"
    if isinstance(step, Advance):
        return f"advance {step.seconds}s"
    if isinstance(step, Kill):
        return f"kill engine {step.engine} (a fresh one takes its place)"
    if isinstance(step, Notify):
        return f"engine {step.engine}: notifications {step.mode}"
    if isinstance(step, RestartStore):
        return "Redis killed and started again"
    return "shutdown"


def engine_for(seed: int, post: Post) -> int:
    """Shared mode: the engine a post (every copy of it) is sent to, drawn from the seed and
    the post's first request id alone, so a shrunk scenario routes its posts the same way."""
    return random.Random(f"{seed}:route:{post.requests[0]}").randrange(ENGINES)


# ---- what a request looks like ------------------------------------------------------------------


def prompt(post: Post) -> str:
    return f"{'another ' if post.other_prompt else ''}prompt for {post.group}"


def request_body(post: Post) -> dict[str, Any]:
    """The /verify body of a post: §10's member with its group marker in the answer."""
    again = f" again#{post.variant}" if post.variant else ""
    text = (
        f"answer-{post.slot}{again} [[q={post.quality}]] {group_marker(post.marker, post.attempt)}"
    )
    body: dict[str, Any] = {
        "responses_create_params": {"input": prompt(post)},
        "response": {
            "id": f"r-{post.marker}-{post.attempt}-{post.slot}-{post.variant}",
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text}],
                }
            ],
        },
    }
    if post.task is None:
        body["_ng_group_id"] = post.group
    else:
        body["_ng_task_index"] = post.task
    body["_ng_group_attempt"] = post.attempt
    body["_ng_rollout_index"] = post.slot
    return body


def scenario_config(settings: Mapping[str, Any]) -> Config:
    return config_from_mapping(
        {
            **SCENARIO_DEFAULTS,
            "cohort_collection_timeout_s": COLLECTION_TIMEOUT,
            "cohort_evaluation_timeout_s": EVALUATION_TIMEOUT,
            "judge_max_concurrency": 4096,
            **settings,
        }
    )


def comparison_pairs(strategy: str, size: int) -> list[tuple[int, int]]:
    if strategy == "circular":
        return [(i, (i + 1) % size) for i in range(size)]
    return [(i, j) for i in range(size) for j in range(i + 1, size)]
