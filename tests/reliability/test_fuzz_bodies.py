"""Property-based fuzzing of /verify and /compare bodies: never a 500, rejections change nothing.

Hypothesis builds valid bodies as JSON trees, mutates them (wrong types, missing fields,
non-standard literals, huge integers, duplicate keys, deep nesting, invalid UTF-8, truncation),
and posts the bytes through the app. A small reference reading of §2.2 and §2.7 says which
status each body must get; accepted bodies must come back as rows that echo them byte for byte.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from genrm_trio.testing import FakeJudge
from genrm_trio.testing.harness import Server, member, running_server

MAX_BODY_BYTES = 1 << 18
MAX_COMPARE_RESPONSES = 3
# The nesting a server must accept; beyond it a 400 is an acceptable implementation limit
# (the spec names none), a 500 never is.
MAX_NESTING = 128
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
COORDINATES = ("_ng_group_id", "_ng_group_attempt", "_ng_rollout_index", "_ng_task_index")
METRICS = (
    "genrm_failed_comparison_rate_per_group",
    "genrm_masked_rollout_rate_per_group",
    "mean_individual_score",
    "std_individual_score",
    "tiebreak_usage_rate",
)
SERVER_OWNED = frozenset(
    {
        "reward",
        "mask_sample",
        "failure_kind",
        "failure_reason",
        "_ng_failure_class",
        "_ng_failure_judge_error",
        *METRICS,
    }
)
ROW_TAIL = ("reward", "mask_sample", "failure_kind", "failure_reason")
CONTENT_TYPES = (
    None,
    "application/json",
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=xyz",
)

FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    # Shrinking a failure found among kilobyte-sized bodies can take minutes; the unshrunk
    # example is reproducible (derandomized) and printed in full.
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
        HealthCheck.large_base_example,
    ],
)


# ---------------------------------------------------------------------------------------------
# JSON trees that keep the client's spelling: keys and scalars are stored as JSON text.


@dataclass
class Lit:
    text: bytes


@dataclass
class Arr:
    items: list[Node]


@dataclass
class Obj:
    pairs: list[tuple[bytes, Node]]


@dataclass
class Deep:
    """``inner`` wrapped in ``depth`` arrays or single-key objects (written without recursion)."""

    inner: Node
    depth: int
    objects: bool


Node = Lit | Arr | Obj | Deep


def key_text(key: str, ascii_only: bool = True) -> bytes:
    return json.dumps(key, ensure_ascii=ascii_only).encode("utf-8")


def dump(node: Node, ws: bytes) -> bytes:
    if isinstance(node, Lit):
        return node.text
    if isinstance(node, Deep):
        opening, closing = (b'{"a":', b"}") if node.objects else (b"[", b"]")
        return opening * node.depth + dump(node.inner, ws) + closing * node.depth
    if isinstance(node, Arr):
        inner = (b"," + ws).join(dump(item, ws) for item in node.items)
        return b"[" + ws + inner + ws + b"]"
    inner = (b"," + ws).join(k + ws + b":" + ws + dump(v, ws) for k, v in node.pairs)
    return b"{" + ws + inner + ws + b"}"


def decoded_key(text: bytes) -> str:
    key: str = json.loads(text)
    return key


def child(node: Node, step: str | int) -> Node | None:
    """The child a reader sees: the last occurrence of a key, or an array element."""
    if isinstance(step, int):
        return node.items[step] if isinstance(node, Arr) and step < len(node.items) else None
    if not isinstance(node, Obj):
        return None
    found = None
    for k, v in node.pairs:
        if decoded_key(k) == step:
            found = v
    return found


def at(root: Node, path: tuple[str | int, ...]) -> Node | None:
    node: Node | None = root
    for step in path:
        if node is None:
            return None
        node = child(node, step)
    return node


def replace(root: Node, path: tuple[str | int, ...], value: Node) -> None:
    parent = at(root, path[:-1])
    step = path[-1]
    if isinstance(step, int):
        if isinstance(parent, Arr) and step < len(parent.items):
            parent.items[step] = value
        return
    if isinstance(parent, Obj):
        for index in reversed(range(len(parent.pairs))):
            if decoded_key(parent.pairs[index][0]) == step:
                parent.pairs[index] = (parent.pairs[index][0], value)
                return
        parent.pairs.append((key_text(step), value))


def delete(root: Node, path: tuple[str | int, ...]) -> None:
    parent = at(root, path[:-1])
    step = path[-1]
    if isinstance(step, int):
        if isinstance(parent, Arr) and step < len(parent.items):
            del parent.items[step]
    elif isinstance(parent, Obj):
        parent.pairs = [(k, v) for k, v in parent.pairs if decoded_key(k) != step]


def positions(root: Node) -> list[tuple[Arr | Obj, int]]:
    """Every (container, index) that holds a value, outermost first."""
    found: list[tuple[Arr | Obj, int]] = []
    pending: list[Node] = [root]
    while pending:
        node = pending.pop()
        if isinstance(node, Arr):
            for index, item in enumerate(node.items):
                found.append((node, index))
                pending.append(item)
        elif isinstance(node, Obj):
            for index, (_, value) in enumerate(node.pairs):
                found.append((node, index))
                pending.append(value)
    return found


def set_position(container: Arr | Obj, index: int, value: Node) -> None:
    if isinstance(container, Arr):
        container.items[index] = value
    else:
        container.pairs[index] = (container.pairs[index][0], value)


def get_position(container: Arr | Obj, index: int) -> Node:
    return container.items[index] if isinstance(container, Arr) else container.pairs[index][1]


def escaped_spelling(key: str) -> bytes:
    """The same key with every ASCII letter written as a \\u escape."""
    spelled = "".join(
        f"\\u{ord(c):04x}" if c.isascii() and c.isalpha() else json.dumps(c)[1:-1] for c in key
    )
    return b'"' + spelled.encode("ascii") + b'"'


# ---------------------------------------------------------------------------------------------
# Strategies

WHITESPACE = st.sampled_from([b"", b" ", b"\n", b"\t ", b"\r\n  "])
ODD_LITERALS = [
    b"null",
    b"true",
    b"false",
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b"-0",
    b"-0.0",
    b"1.0",
    b"1E+2",
    b"1e400",
    b"-1e400",
    b'"\\ud800"',
    b'"\\udfff\\ud800"',
    b'"\\ud83d\\ude00"',
    b'""',
    b'"h\\u00e9llo \\"q\\" \\\\"',
]
# Integer-field boundaries (W-7) and values around them.
BOUNDARY_LITERALS = [
    b"0",
    b"1",
    b"2",
    b"-1",
    b"9223372036854775807",
    b"9223372036854775808",
    b"-9223372036854775808",
    b"-9223372036854775809",
    b"1.5",
    b"1e0",
    b'"1"',
    b"[]",
    b"{}",
    b"[0]",
]


def huge_integer(sign: bool, digits: int) -> bytes:
    return (b"-" if sign else b"") + b"1" + b"7" * (digits - 1)


huge_integers = st.builds(
    huge_integer, st.booleans(), st.one_of(st.integers(19, 60), st.integers(4290, 5000))
)
strings = st.builds(lambda s, a: key_text(s, a), st.text(max_size=12), st.booleans())
scalars: st.SearchStrategy[bytes] = st.one_of(
    st.sampled_from(ODD_LITERALS),
    st.integers(-(2**70), 2**70).map(lambda i: str(i).encode()),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda f: repr(f).encode()),
    huge_integers,
    strings,
)
free_keys = st.sampled_from(["a", "b", "id", "output", "text", "é", ""]).map(key_text)
free_values: st.SearchStrategy[Node] = st.recursive(
    scalars.map(Lit),
    lambda kids: st.one_of(
        st.lists(kids, max_size=4).map(Arr),
        st.lists(st.tuples(free_keys, kids), max_size=4).map(Obj),
    ),
    max_leaves=10,
)
field_values: st.SearchStrategy[Node] = st.one_of(
    st.sampled_from(BOUNDARY_LITERALS + ODD_LITERALS).map(Lit),
    scalars.map(Lit),
    free_values,
    st.sampled_from([1024, 1025, 0]).map(lambda n: Lit(key_text("g" * n))),
    st.sampled_from([1024, 1025]).map(lambda n: Lit(b'"' + b"\\ud83d\\ude00" * n + b'"')),
)
EXTRA_KEYS = [
    "task",
    "group_id",
    "group_attempt",
    "rollout_index",
    "task_index",
    "_ng_rollout_id",
    "reward",
    "mask_sample",
    "failure_reason",
    "failure_kind",
    "_ng_failure_class",
    "mean_individual_score",
    "baseline_response",
    "x\u00e9",
]


def message(role: str, text: Node) -> Obj:
    return Obj([(key_text("role"), Lit(key_text(role))), (key_text("content"), text)])


def output_text(text: str) -> Obj:
    return Obj([(key_text("type"), Lit(b'"output_text"')), (key_text("text"), Lit(key_text(text)))])


@st.composite
def responses(draw: st.DrawFn, name: str) -> Obj:
    answer = draw(st.text(max_size=20)) + f" [[q={draw(st.integers(1, 5))}]]"
    item = Obj(
        [
            (key_text("type"), Lit(b'"message"')),
            (key_text("role"), Lit(b'"assistant"')),
            (key_text("content"), Arr([output_text(answer)])),
        ]
    )
    pairs: list[tuple[bytes, Node]] = [
        (key_text("id"), Lit(key_text(name))),
        (key_text("output"), Arr([item])),
    ]
    for extra in draw(
        st.lists(st.sampled_from(["usage", "generation_log_probs", "b"]), max_size=2)
    ):
        pairs.append((key_text(extra), draw(free_values)))
    return Obj(draw(st.permutations(pairs)))


def input_text(text: Node) -> Arr:
    return Arr([Obj([(key_text("type"), Lit(b'"input_text"')), (key_text("text"), text)])])


def array(items: Sequence[Node]) -> Arr:
    return Arr(list(items))


ROLES = st.sampled_from(["user", "system", "developer", "tool", "assistant"])
prompts: st.SearchStrategy[Node] = st.one_of(
    strings.map(Lit),
    st.lists(
        st.builds(message, ROLES, st.one_of(strings.map(Lit), strings.map(Lit).map(input_text))),
        min_size=1,
        max_size=3,
    ).map(array),
)


@st.composite
def verify_trees(draw: st.DrawFn, slots: int) -> Obj:
    """A valid /verify body for a server with ``slots`` rollouts per prompt."""
    params: list[tuple[bytes, Node]] = [(key_text("input"), draw(prompts))]
    if draw(st.booleans()):
        params.append((key_text("temperature"), draw(free_values)))
    pairs: list[tuple[bytes, Node]] = [
        (key_text("responses_create_params"), Obj(params)),
        (key_text("response"), draw(responses("r-fuzz"))),
        (key_text("_ng_rollout_index"), Lit(str(draw(st.integers(0, slots - 1))).encode())),
    ]
    group_id = draw(st.one_of(st.none(), st.just("null"), st.text(min_size=1, max_size=8)))
    if group_id == "null":
        pairs.append((key_text("_ng_group_id"), Lit(b"null")))
    elif group_id is not None:
        pairs.append((key_text("_ng_group_id"), Lit(key_text(group_id, draw(st.booleans())))))
    if draw(st.booleans()):
        pairs.append((key_text("_ng_group_attempt"), Lit(str(draw(st.integers(0, 3))).encode())))
    if draw(st.booleans()):
        task = draw(st.one_of(st.integers(INT64_MIN, INT64_MAX).map(str), st.just("null")))
        pairs.append((key_text("_ng_task_index"), Lit(task.encode())))
    for name in ("prompt_id", "principle"):
        if draw(st.booleans()):
            pairs.append((key_text(name), Lit(draw(st.one_of(strings, st.just(b"null"))))))
    if draw(st.booleans()):
        pairs.append((key_text("instance_config"), draw(free_values)))
    for extra in draw(st.lists(st.sampled_from(EXTRA_KEYS), max_size=3, unique=True)):
        pairs.append((key_text(extra), draw(free_values)))
    return Obj(draw(st.permutations(pairs)))


@st.composite
def compare_trees(draw: st.DrawFn) -> Obj:
    history = Arr(
        draw(
            st.lists(
                st.builds(message, ROLES, strings.map(Lit)),
                max_size=3,
            )
        )
    )
    count = draw(st.integers(0, MAX_COMPARE_RESPONSES))
    answers = Arr([draw(responses(f"r-{i}")) for i in range(count)])
    pairs: list[tuple[bytes, Node]] = [
        (key_text("conversation_history"), history),
        (key_text("response_objs"), answers),
    ]
    if draw(st.booleans()):
        pairs.append((key_text("principle"), Lit(draw(st.one_of(strings, st.just(b"null"))))))
    for extra in draw(st.lists(st.sampled_from(["baseline_response", "x", "metrics"]), max_size=2)):
        pairs.append((key_text(extra), draw(free_values)))
    return Obj(draw(st.permutations(pairs)))


Mutation = Callable[[st.DrawFn, Obj, tuple[tuple[str | int, ...], ...]], Node]


def wrong_value(draw: st.DrawFn, root: Obj, paths: tuple[tuple[str | int, ...], ...]) -> Node:
    replace(root, draw(st.sampled_from(paths)), draw(field_values))
    return root


def missing_field(draw: st.DrawFn, root: Obj, paths: tuple[tuple[str | int, ...], ...]) -> Node:
    delete(root, draw(st.sampled_from(paths)))
    return root


def odd_literal_anywhere(draw: st.DrawFn, root: Obj, paths: Any) -> Node:
    spots = positions(root)
    if not spots:
        return root
    container, index = spots[draw(st.integers(0, len(spots) - 1))]
    literal = draw(st.one_of(st.sampled_from(ODD_LITERALS), huge_integers))
    set_position(container, index, Lit(literal))
    return root


def duplicate_key(draw: st.DrawFn, root: Obj, paths: Any) -> Node:
    objects = [root] + [
        node for c, i in positions(root) if isinstance(node := get_position(c, i), Obj)
    ]
    target = objects[draw(st.integers(0, len(objects) - 1))]
    if not target.pairs:
        target.pairs.append((key_text("a"), draw(free_values)))
    key, _ = target.pairs[draw(st.integers(0, len(target.pairs) - 1))]
    spelling = draw(st.sampled_from([key, escaped_spelling(decoded_key(key))]))
    target.pairs.insert(draw(st.integers(0, len(target.pairs))), (spelling, draw(field_values)))
    return root


def deep_nesting(draw: st.DrawFn, root: Obj, paths: Any) -> Node:
    spots = positions(root)
    if not spots:
        return root
    container, index = spots[draw(st.integers(0, len(spots) - 1))]
    value = get_position(container, index)
    depth = draw(st.one_of(st.integers(1, 40), st.integers(115, 140), st.just(30000)))
    set_position(container, index, Deep(value, depth, draw(st.booleans())))
    return root


def large_value(draw: st.DrawFn, root: Obj, paths: Any) -> Node:
    """A value of tens of kilobytes (token ids, a long text), so bodies of every size occur."""
    spots = positions(root)
    if not spots:
        return root
    container, index = spots[draw(st.integers(0, len(spots) - 1))]
    size = draw(st.sampled_from([70_000, 150_000]))
    if draw(st.booleans()):
        value = Lit(b"[" + b",".join(b"%d" % (i % 151_000) for i in range(size // 6)) + b"]")
    else:
        value = Lit(key_text("\u00e9 \\ \n" * (size // 5), ascii_only=draw(st.booleans())))
    set_position(container, index, value)
    return root


def respelled_key(draw: st.DrawFn, root: Obj, paths: Any) -> Node:
    if root.pairs:
        index = draw(st.integers(0, len(root.pairs) - 1))
        key, value = root.pairs[index]
        root.pairs[index] = (escaped_spelling(decoded_key(key)), value)
    return root


def extra_field(draw: st.DrawFn, root: Obj, paths: Any) -> Node:
    name = draw(st.one_of(st.sampled_from(EXTRA_KEYS), st.text(max_size=6)))
    root.pairs.insert(draw(st.integers(0, len(root.pairs))), (key_text(name), draw(free_values)))
    return root


def not_an_object(draw: st.DrawFn, root: Obj, paths: Any) -> Node:
    return draw(st.one_of(st.builds(lambda o: Arr([o]), st.just(root)), free_values))


MUTATIONS: list[Mutation] = [
    wrong_value,
    wrong_value,
    wrong_value,
    missing_field,
    missing_field,
    odd_literal_anywhere,
    duplicate_key,
    deep_nesting,
    large_value,
    respelled_key,
    extra_field,
    not_an_object,
]
VERIFY_PATHS: tuple[tuple[str | int, ...], ...] = (
    ("responses_create_params",),
    ("responses_create_params", "input"),
    ("responses_create_params", "input", 0),
    ("response",),
    ("response", "output"),
    ("response", "output", 0),
    ("_ng_group_id",),
    ("_ng_group_attempt",),
    ("_ng_rollout_index",),
    ("_ng_task_index",),
    ("prompt_id",),
    ("principle",),
    ("instance_config",),
    ("_ng_rollout_id",),
)
COMPARE_PATHS: tuple[tuple[str | int, ...], ...] = (
    ("conversation_history",),
    ("conversation_history", 0),
    ("conversation_history", 0, "role"),
    ("conversation_history", 0, "content"),
    ("response_objs",),
    ("response_objs", 0),
    ("response_objs", 0, "output"),
    ("response_objs", 1, "output", 0),
    ("principle",),
    ("baseline_response",),
)
INVALID_UTF8 = [
    b"\xff",
    b"\xfe",
    b"\x80",
    b"\xc0\xaf",
    b"\xc3\x28",
    b"\xe2\x82",
    b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80",
]


@dataclass
class Body:
    """A body as posted, and the top-level members it was serialized from (when it was)."""

    raw: bytes
    members: list[tuple[bytes, bytes]] | None
    content_type: str | None = None


def serialize(root: Node, ws: bytes) -> Body:
    if not isinstance(root, Obj):
        return Body(dump(root, ws), None)
    members = [(k, dump(v, ws)) for k, v in root.pairs]
    inner = (b"," + ws).join(k + ws + b":" + ws + v for k, v in members)
    return Body(b"{" + ws + inner + ws + b"}", members)


@st.composite
def bodies(draw: st.DrawFn, trees: st.SearchStrategy[Obj], paths: Any) -> Body:
    root: Node = draw(trees)
    for mutation in draw(st.lists(st.sampled_from(MUTATIONS), max_size=3)):
        if isinstance(root, Obj):
            root = mutation(draw, root, paths)
    body = serialize(root, draw(WHITESPACE))
    byte_mutation = draw(st.sampled_from(["none"] * 8 + ["truncate", "utf8", "flip", "oversize"]))
    raw = body.raw
    if byte_mutation == "truncate":
        raw = raw[: draw(st.integers(0, max(len(raw) - 1, 0)))]
    elif byte_mutation == "utf8":
        spot = draw(st.integers(0, len(raw)))
        raw = raw[:spot] + draw(st.sampled_from(INVALID_UTF8)) + raw[spot:]
    elif byte_mutation == "flip" and raw:
        spot = draw(st.integers(0, len(raw) - 1))
        raw = raw[:spot] + bytes([draw(st.integers(0, 255))]) + raw[spot + 1 :]
    elif byte_mutation == "oversize":
        raw = raw + b" " * (MAX_BODY_BYTES + 1 - len(raw))
    if raw != body.raw:
        body = Body(raw, None)
    body.content_type = draw(st.sampled_from(CONTENT_TYPES))
    return body


# ---------------------------------------------------------------------------------------------
# The reference reading of the spec


@dataclass(frozen=True)
class IntLit:
    """A JSON integer literal (no fraction, no exponent), kept as text: any size is valid."""

    text: str

    def value(self) -> int:
        # Beyond 40 digits only the sign matters for range checks.
        if len(self.text.lstrip("-")) > 40:
            return -(10**41) if self.text.startswith("-") else 10**41
        return int(self.text)


class Members(dict[str, Any]):
    """A decoded object (last duplicate wins) that remembers its repeated keys and key order."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__()
        self.repeated: list[str] = []
        self.order: list[str] = []
        for key, value in pairs:
            if key in self:
                if key not in self.repeated:
                    self.repeated.append(key)
            else:
                self.order.append(key)
            self[key] = value


def read_json(text: str | bytes) -> Any:
    return json.loads(text, object_pairs_hook=Members, parse_int=IntLit)


_STRING_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


_NOT_BRACKETS = bytes(range(256)).translate(None, b"[]{}")


def nesting(raw: bytes) -> int:
    deepest = depth = 0
    for byte in _STRING_TOKEN.sub(b"", raw).translate(None, _NOT_BRACKETS):
        if byte in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        elif byte in b"]}":
            depth -= 1
    return deepest


@dataclass
class Expected:
    """What the server must answer: a status (None: accepted) and the fields at fault."""

    status: int | None
    paths: list[str] = field(default_factory=list)
    repeated: list[str] = field(default_factory=list)
    too_deep: bool = False
    value: Members | None = None


def parse_top(raw: bytes) -> Expected | Members:
    if len(raw) > MAX_BODY_BYTES:
        return Expected(413)
    too_deep = nesting(raw) > MAX_NESTING
    try:
        value = read_json(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        return Expected(400, too_deep=too_deep)
    if not isinstance(value, Members):
        return Expected(400, too_deep=too_deep)
    if value.repeated:
        return Expected(400, repeated=value.repeated, too_deep=too_deep)
    if too_deep:
        return Expected(None, too_deep=True, value=value)
    return value


def is_int(value: Any, low: int, high: int) -> bool:
    return isinstance(value, IntLit) and low <= value.value() <= high


def check_objects(items: Any, path: str, faults: list[str]) -> None:
    if not isinstance(items, list):
        faults.append(path)
        return
    faults.extend(f"{path}[{i}]" for i, item in enumerate(items) if not isinstance(item, Members))


def check_response(value: Any, path: str, faults: list[str]) -> None:
    if not isinstance(value, Members):
        faults.append(path)
    elif "output" not in value:
        faults.append(f"{path}.output")
    else:
        check_objects(value["output"], f"{path}.output", faults)


def expect_verify(raw: bytes, slots: int) -> Expected:
    """§2.2 for a circular server with ``slots`` rollouts per prompt (W-4…W-12)."""
    top = parse_top(raw)
    if isinstance(top, Expected) and top.value is None:
        return top
    value = top.value if isinstance(top, Expected) else top
    assert value is not None
    faults: list[str] = []
    params = value.get("responses_create_params")
    if not isinstance(params, Members):
        faults.append("responses_create_params")
    elif "input" not in params:
        faults.append("responses_create_params.input")
    elif not isinstance(params["input"], str):
        check_objects(params["input"], "responses_create_params.input", faults)
    if "response" not in value:
        faults.append("response")
    else:
        check_response(value["response"], "response", faults)
    group_id = value.get("_ng_group_id")
    if group_id is not None and not (isinstance(group_id, str) and 1 <= len(group_id) <= 1024):
        faults.append("_ng_group_id")
    if "_ng_group_attempt" in value and not is_int(value["_ng_group_attempt"], 0, INT64_MAX):
        faults.append("_ng_group_attempt")
    index = value.get("_ng_rollout_index")
    if index is None:
        if slots > 1:
            faults.append("_ng_rollout_index")
    elif not is_int(index, INT64_MIN, INT64_MAX) or (slots > 1 and not 0 <= index.value() < slots):
        faults.append("_ng_rollout_index")
    task = value.get("_ng_task_index")
    if task is not None and not is_int(task, INT64_MIN, INT64_MAX):
        faults.append("_ng_task_index")
    for name in ("prompt_id", "principle"):
        if value.get(name) is not None and not isinstance(value[name], str):
            faults.append(name)
    too_deep = isinstance(top, Expected) and top.too_deep
    if faults:
        return Expected(422, paths=faults, too_deep=too_deep)
    return Expected(None, too_deep=too_deep, value=value)


def expect_compare(raw: bytes) -> Expected:
    """§2.7 for a circular server."""
    top = parse_top(raw)
    if isinstance(top, Expected) and top.value is None:
        return top
    value = top.value if isinstance(top, Expected) else top
    assert value is not None
    faults: list[str] = []
    history = value.get("conversation_history")
    if not isinstance(history, list):
        faults.append("conversation_history")
    else:
        for i, item in enumerate(history):
            path = f"conversation_history[{i}]"
            if not isinstance(item, Members):
                faults.append(path)
                continue
            faults.extend(
                f"{path}.{name}"
                for name in ("role", "content")
                if not isinstance(item.get(name), str)
            )
    answers = value.get("response_objs")
    if not isinstance(answers, list):
        faults.append("response_objs")
    elif len(answers) > MAX_COMPARE_RESPONSES:
        faults.append("response_objs")
    else:
        for i, answer in enumerate(answers):
            check_response(answer, f"response_objs[{i}]", faults)
    if value.get("principle") is not None and not isinstance(value["principle"], str):
        faults.append("principle")
    too_deep = isinstance(top, Expected) and top.too_deep
    if faults:
        return Expected(422, paths=faults, too_deep=too_deep)
    return Expected(None, too_deep=too_deep, value=value)


# ---------------------------------------------------------------------------------------------
# Posting and checking


@dataclass
class Posted:
    status: int
    raw: bytes
    content_type: str


async def post(server: Server, path: str, body: Body) -> Posted:
    headers = {} if body.content_type is None else {"content-type": body.content_type}
    response = await server.client.post(path, content=body.raw, headers=headers)
    return Posted(response.status_code, response.content, response.headers["content-type"])


def assert_rejection(reply: Posted, expected: Expected) -> None:
    """W-3, W-4, W-6: a 4xx names what is wrong in a single ``detail`` string."""
    body = json.loads(reply.raw)
    assert list(body) == ["detail"] and isinstance(body["detail"], str), reply.raw
    detail = body["detail"]
    if reply.status == 413:
        assert detail == f"request body exceeds {MAX_BODY_BYTES} bytes"
    elif reply.status == 400:
        if expected.repeated and not expected.too_deep:
            assert detail in {f"duplicate key '{key}'" for key in expected.repeated}, detail
        else:
            assert detail.startswith("invalid JSON body: "), detail
    elif reply.status == 422 and expected.status == 422:
        named = [p for p in expected.paths if re.match(re.escape(p) + r"(:| |$)", detail)]
        assert named, (detail, expected.paths)


def state(server: Server) -> tuple[Any, ...]:
    counters = server.engine.counters
    return (
        server.engine.statistics(),
        server.calls(),
        counters.fingerprints,
        counters.extractions,
        counters.conversions,
    )


def assert_status(reply: Posted, expected: Expected) -> None:
    event(f"status {reply.status}")
    assert reply.status != 500, reply.raw
    assert reply.content_type == "application/json"
    if expected.status is not None:
        assert reply.status == expected.status or (expected.too_deep and reply.status == 400), (
            reply.status,
            reply.raw[:300],
            expected,
        )
    else:
        assert reply.status == 200 or (expected.too_deep and reply.status == 400), (
            reply.status,
            reply.raw[:300],
            expected,
        )


def int_or_none(value: Any) -> int | None:
    return None if value is None else value.value()


def assert_row(reply: Posted, body: Body, request: Members, group_mode: bool) -> dict[str, Any]:
    """W-20…W-22: a scored row echoing every request member as sent, coordinates canonical."""
    assert reply.status == 200, reply.raw[:300]
    row = read_json(reply.raw)
    assert isinstance(row, Members) and not row.repeated
    echoed = [k for k in request.order if k not in SERVER_OWNED and k != "_ng_rollout_id"]
    expected_keys = [*echoed, *(c for c in COORDINATES if c not in request), *ROW_TAIL]
    if group_mode:
        expected_keys += METRICS
    assert row.order == expected_keys
    assert row["_ng_group_id"] == request.get("_ng_group_id")
    attempt = request.get("_ng_group_attempt")
    assert int_or_none(row["_ng_group_attempt"]) == (0 if attempt is None else attempt.value())
    assert int_or_none(row["_ng_rollout_index"]) == int_or_none(request.get("_ng_rollout_index"))
    assert int_or_none(row["_ng_task_index"]) == int_or_none(request.get("_ng_task_index"))
    assert body.members is not None
    for key, value in body.members:
        name = decoded_key(key)
        if name in echoed and name not in COORDINATES:
            assert key + b":" + value in reply.raw, (name, value[:200])
    assert (row["mask_sample"], row["failure_kind"], row["failure_reason"]) == (
        False,
        None,
        None,
    )
    assert isinstance(row["reward"], float) and math.isfinite(row["reward"])
    for name in METRICS if group_mode else ():
        assert isinstance(row[name], float) and math.isfinite(row[name])
    return row


def sibling_of(body: Body, request: Members, slot: int) -> Body:
    """The member for the other slot of the same group: same coordinates and prompt."""
    assert body.members is not None
    answer = dump(
        Obj(
            [
                (key_text("id"), Lit(b'"r-sibling"')),
                (
                    key_text("output"),
                    Arr(
                        [
                            Obj(
                                [
                                    (key_text("type"), Lit(b'"message"')),
                                    (key_text("content"), Arr([output_text("sibling [[q=3]]")])),
                                ]
                            )
                        ]
                    ),
                ),
            ]
        ),
        b"",
    )
    members = []
    for key, value in body.members:
        name = decoded_key(key)
        if name == "response":
            value = answer
        elif name == "_ng_rollout_index":
            value = str(slot).encode()
        members.append((key, value))
    raw = b"{" + b",".join(k + b":" + v for k, v in members) + b"}"
    return Body(raw, members)


def run(check: Callable[[], Any]) -> None:
    trio.run(check, clock=trio.testing.MockClock(autojump_threshold=0))


# ---------------------------------------------------------------------------------------------
# The properties


@FUZZ
@given(bodies(verify_trees(2), VERIFY_PATHS))
def test_group_mode_verify_bodies(body: Body) -> None:
    # W-4…W-12, W-20…W-22: group mode (N = 2, circular)
    expected = expect_verify(body.raw, 2)

    async def check() -> None:
        async with running_server(max_body_bytes=MAX_BODY_BYTES) as server:
            before = state(server)
            if expected.status is not None or expected.value is None or body.members is None:
                reply = await post(server, "/verify", body)
                assert_status(reply, expected)
                if reply.status in (400, 413, 422):
                    assert_rejection(reply, expected)
                    assert state(server) == before
                else:
                    # A body accepted without a sibling waits for its group, which then
                    # expires: the spec's 503 for a cohort that did not collect.
                    assert reply.status == 503
                    assert (
                        "did not collect 2 unique rollout indices within 5.0s" in reply.raw.decode()
                    )
                server.engine.check_invariants()
                return
            request = expected.value
            slot = request["_ng_rollout_index"].value()
            sibling = sibling_of(body, request, 1 - slot)
            replies: dict[str, Posted] = {}

            async def send(label: str, which: Body) -> None:
                replies[label] = await post(server, "/verify", which)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(send, "mutant", body)
                await trio.testing.wait_all_tasks_blocked()
                if "mutant" in replies:
                    # Only a nesting limit may turn down a body the spec accepts.
                    assert_status(replies["mutant"], expected)
                    assert replies["mutant"].status == 400
                    assert state(server) == before
                    return
                nursery.start_soon(send, "sibling", sibling)
            event("status 200 (completed with its sibling)")
            mine, theirs = replies["mutant"], replies["sibling"]
            assert_row(mine, body, request, group_mode=True)
            sibling_row = assert_row(theirs, sibling, read_json(sibling.raw), group_mode=True)
            # Under circular pairing without position bias a rollout's reward is its quality.
            assert sibling_row["reward"] == 3.0
            assert server.calls() == before[1] + 2
            server.engine.check_invariants()

    run(check)


@FUZZ
@given(bodies(verify_trees(1), VERIFY_PATHS))
def test_single_rollout_verify_bodies(body: Body) -> None:
    # W-35: single-rollout mode answers at once with default_score and keeps no state
    expected = expect_verify(body.raw, 1)

    async def check() -> None:
        async with running_server(
            max_body_bytes=MAX_BODY_BYTES, num_rollouts_per_prompt=1
        ) as server:
            before = state(server)
            reply = await post(server, "/verify", body)
            assert_status(reply, expected)
            if reply.status != 200:
                assert_rejection(reply, expected)
            elif body.members is not None and expected.value is not None:
                row = assert_row(reply, body, expected.value, group_mode=False)
                assert row["reward"] == 3.0
            assert state(server) == before
            server.engine.check_invariants()

    run(check)


@FUZZ
@given(bodies(compare_trees(), COMPARE_PATHS))
def test_compare_bodies(body: Body) -> None:
    # §2.7, W-40…W-45: /compare validates first, judges N answers, keeps no state
    expected = expect_compare(body.raw)

    async def check() -> None:
        async with running_server(
            max_body_bytes=MAX_BODY_BYTES, max_compare_responses=MAX_COMPARE_RESPONSES
        ) as server:
            before = state(server)
            reply = await post(server, "/compare", body)
            assert_status(reply, expected)
            if reply.status != 200:
                assert_rejection(reply, expected)
                assert state(server) == before
                return
            result = read_json(reply.raw)
            assert result.order == ["rewards", "comparison_results", "metrics"]
            count = len(expected.value["response_objs"]) if expected.value is not None else 0
            rewards = result["rewards"]
            assert len(rewards) == count
            assert all(isinstance(r, float) and math.isfinite(r) for r in rewards)
            calls = count if count >= 2 else 0  # circular: N comparisons, 2 when N = 2
            assert server.calls() == before[1] + calls
            if count < 2:
                assert result["comparison_results"] is None and result["metrics"] is None
            else:
                assert len(result["comparison_results"]) == calls
            stats, _, *work = state(server)
            assert (stats, work) == (before[0], list(before[2:]))

    run(check)


@FUZZ
@given(st.binary(max_size=300), st.sampled_from(["/verify", "/compare"]))
def test_arbitrary_bytes(raw: bytes, path: str) -> None:
    # W-4, W-5: any byte string is answered with a JSON error or a row, never a 500
    expected = expect_verify(raw, 2) if path == "/verify" else expect_compare(raw)

    async def check() -> None:
        async with running_server(judge=FakeJudge(), max_body_bytes=MAX_BODY_BYTES) as server:
            before = state(server)
            reply = await post(server, path, Body(raw, None))
            assert reply.status != 500
            assert reply.status == (expected.status or reply.status)
            if reply.status in (400, 413, 422):
                assert_rejection(reply, expected)
                assert state(server) == before

    run(check)


# ---------------------------------------------------------------------------------------------
# Findings of the fuzzers, pinned as plain examples

THOUSANDS_OF_DIGITS = b"1" + b"7" * 4999


def raw_member(i: int, **raw_values: bytes) -> bytes:
    """``member(i)`` as JSON text, with the given top-level keys set to raw JSON values."""
    body = member(i)
    for key in raw_values:
        body[key] = f"@{key}@"
    raw = json.dumps(body).encode()
    for key, value in raw_values.items():
        raw = raw.replace(json.dumps(f"@{key}@").encode(), value)
    return raw


@pytest.mark.parametrize("key", ["_ng_group_attempt", "_ng_rollout_index", "_ng_task_index"])
async def test_an_integer_field_with_thousands_of_digits_is_a_422(key: str) -> None:
    # W-5, W-7: an integer outside [-2^63, 2^63-1] is a 422 however many digits it has
    async with running_server() as server:
        before = state(server)
        raw = raw_member(0, **{key: THOUSANDS_OF_DIGITS})
        reply = await post(server, "/verify", Body(raw, None))
        assert reply.status == 422, reply.raw[:300]
        assert json.loads(reply.raw)["detail"].startswith(f"{key}: expected an integer")
        assert state(server) == before


@pytest.mark.parametrize(
    "extra",
    [
        {"response": b'{"id":"r-big","output":[],"generation_token_ids":[%s]}'},
        {"responses_create_params": b'{"input":"2+2?","seed":%s}'},
        {"task": b"[%s]", "log_probs": b"[NaN, -Infinity]"},
    ],
    ids=["response", "responses_create_params", "extra field beside NaN"],
)
async def test_free_form_integers_of_any_size_are_echoed(
    extra: dict[str, bytes], autojump_clock: Any
) -> None:
    # W-8, W-21: free-form values may hold integers of any size, echoed byte for byte
    values = {key: value.replace(b"%s", THOUSANDS_OF_DIGITS) for key, value in extra.items()}
    async with running_server() as server:
        raw = raw_member(0, **values)
        replies: dict[int, Posted] = {}

        async def send(slot: int, body: bytes) -> None:
            replies[slot] = await post(server, "/verify", Body(body, None))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send, 0, raw)
            nursery.start_soon(send, 1, json.dumps(member(1)).encode())
        assert replies[0].status == 200, replies[0].raw[:300]
        for key, value in values.items():
            assert json.dumps(key).encode() + b":" + value in replies[0].raw
        assert replies[1].status == 200
        assert server.calls() == 2


async def test_compare_answers_may_hold_integers_of_any_size() -> None:
    # §2.7, W-40: an answer is any object with an output array
    output = json.dumps(member(0)["response"]["output"]).encode()
    answer = b'{"output":%s,"generation_token_ids":[%s]}' % (output, THOUSANDS_OF_DIGITS)
    raw = b'{"conversation_history":[],"response_objs":[%s,%s]}' % (answer, answer)
    async with running_server() as server:
        reply = await post(server, "/compare", Body(raw, None))
        assert reply.status == 200, reply.raw[:300]
        assert json.loads(reply.raw)["rewards"] == [3.0, 3.0]
        assert server.calls() == 2
