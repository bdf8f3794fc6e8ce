"""Helpers shared by the benchmark scripts: realistic /verify bodies, CPU timing with median and
p95, resident memory read from /proc, and the caveat line every benchmark prints first."""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import platform
import random
import resource
import signal
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

GIB = 1 << 30
MIB = 1 << 20

# Token ids are drawn below this (a common vocabulary size).
VOCABULARY = 151_936


# ---- the machine -----------------------------------------------------------------------------


def machine_line() -> str:
    """One line naming the machine: cores, CPU model, Python and msgspec versions, load."""
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = "n/a"
    try:
        load = " ".join(f"{value:.2f}" for value in os.getloadavg())
    except OSError:
        pass
    return (
        f"{os.cpu_count()} cores ({model}), Python {platform.python_version()}, "
        f"msgspec {msgspec.__version__}, load average {load}"
    )


# ---- bodies ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BodyShape:
    """The size of one rollout: token arrays and texts, as NeMo Gym sends them."""

    generated_tokens: int
    prompt_tokens: int
    reasoning_chars: int = 2_000
    answer_chars: int = 600
    prompt_chars: int = 1_200


def log_prob(rng: random.Random) -> float:
    """A log-probability as vLLM reports it: a float32 value widened to a Python float, whose
    shortest spelling has 16 or 17 significant digits."""
    value: float = struct.unpack("<f", struct.pack("<f", -rng.expovariate(1.5)))[0]
    return value


def _text(rng: random.Random, chars: int, marker: str) -> str:
    words = ("the", "sum", "of", "two", "odd", "integers", "is", "even", "because", "2k+1")
    parts = [marker]
    size = len(marker)
    while size < chars:
        word = rng.choice(words)
        parts.append(word)
        size += len(word) + 1
    return " ".join(parts)[:chars]


def response_object(shape: BodyShape, *, seed: int = 0, slot: int = 0) -> dict[str, Any]:
    """A Responses-API object with NeMo Gym's training fields on its assistant message."""
    rng = random.Random(seed * 1_000_003 + slot)
    quality = 1 + slot % 5
    return {
        "id": f"resp_{seed}_{slot}",
        "object": "response",
        "created_at": 1_767_225_600 + slot,
        "model": "policy",
        "status": "completed",
        "output": [
            {
                "type": "reasoning",
                "id": f"rs_{seed}_{slot}",
                "summary": [
                    {
                        "type": "summary_text",
                        "text": _text(rng, shape.reasoning_chars, f"slot {slot}:"),
                    }
                ],
            },
            {
                "type": "message",
                "id": f"msg_{seed}_{slot}",
                "role": "assistant",
                "status": "completed",
                "content": [
                    {
                        "type": "output_text",
                        "text": _text(rng, shape.answer_chars, f"[[q={quality}]]"),
                        "annotations": [],
                    }
                ],
                "prompt_token_ids": [rng.randrange(VOCABULARY) for _ in range(shape.prompt_tokens)],
                "generation_token_ids": [
                    rng.randrange(VOCABULARY) for _ in range(shape.generated_tokens)
                ],
                "generation_log_probs": [log_prob(rng) for _ in range(shape.generated_tokens)],
            },
        ],
        "usage": {
            "input_tokens": shape.prompt_tokens,
            "output_tokens": shape.generated_tokens,
            "total_tokens": shape.prompt_tokens + shape.generated_tokens,
        },
    }


def verify_body_object(
    shape: BodyShape, *, seed: int = 0, group_id: str = "g-0", slot: int = 0, attempt: int = 0
) -> dict[str, Any]:
    """A full /verify body as a plain value (see ``verify_body`` for its bytes)."""
    rng = random.Random(seed)
    return {
        "responses_create_params": {
            "input": [
                {"role": "system", "content": "You are a careful mathematician."},
                {"role": "user", "content": _text(rng, shape.prompt_chars, f"prompt {seed}:")},
            ],
            "temperature": 1.0,
            "max_output_tokens": shape.generated_tokens,
        },
        "response": response_object(shape, seed=seed, slot=slot),
        "_ng_group_id": group_id,
        "_ng_group_attempt": attempt,
        "_ng_rollout_index": slot,
        "_ng_task_index": seed,
        "instance_config": {"task": "parity"},
    }


def verify_body(
    shape: BodyShape, *, seed: int = 0, group_id: str = "g-0", slot: int = 0, attempt: int = 0
) -> bytes:
    """A /verify body as Python's ``json.dumps`` writes it (``", "`` and ``": "`` separators),
    the spelling most Python clients send."""
    import json

    value = verify_body_object(shape, seed=seed, group_id=group_id, slot=slot, attempt=attempt)
    return json.dumps(value).encode()


# ---- timing ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    """CPU seconds of repeated runs of one step."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def p95(self) -> float:
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]

    @property
    def minimum(self) -> float:
        return min(self.samples)


def cpu_times(
    steps: Sequence[tuple[str, Callable[[], Any]]], *, repeat: int, warmup: int = 3
) -> dict[str, Timing]:
    """CPU time (this thread's) of each step, the steps interleaved round by round so that a
    change in the machine's load touches every step alike."""
    for _ in range(warmup):
        for _, step in steps:
            step()
    samples: dict[str, list[float]] = {name: [] for name, _ in steps}
    clock = time.thread_time_ns
    for _ in range(repeat):
        for name, step in steps:
            start = clock()
            step()
            samples[name].append((clock() - start) / 1e9)
    gc.collect()
    return {name: Timing(tuple(values)) for name, values in samples.items()}


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def ratio(numerator: float, denominator: float) -> str:
    if denominator <= 0:
        return "n/a"
    return f"{numerator / denominator:.2f}x"


# ---- memory ------------------------------------------------------------------------------------


def _status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no {field}")


def rss_bytes(pid: int | None = None) -> int:
    """Resident set size of process ``pid`` (default: this one) now."""
    return _status_kib(pid or os.getpid(), "VmRSS") * 1024


def peak_rss_bytes(pid: int | None = None) -> int:
    """Peak resident set size (VmHWM) of process ``pid`` since it started or since
    ``reset_peak_rss``."""
    return _status_kib(pid or os.getpid(), "VmHWM") * 1024


def reset_peak_rss(pid: int | None = None) -> bool:
    """Reset VmHWM to the current RSS (Linux ``clear_refs`` 5); False where not permitted."""
    try:
        with open(f"/proc/{pid or os.getpid()}/clear_refs", "w", encoding="ascii") as refs:
            refs.write("5")
    except OSError:
        return False
    return True


def gib(size: float) -> str:
    return f"{size / GIB:.3f}"


def mib(size: float) -> str:
    return f"{size / MIB:.1f}"


# ---- output ------------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table, columns padded so that it also reads well on a terminal."""
    widths = [len(header) for header in headers]
    for row in rows:
        widths = [max(width, len(cell)) for width, cell in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return (
            "| "
            + " | ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True))
            + " |"
        )

    rule = "|" + "|".join("-" * (width + 2) for width in widths) + "|"
    return "\n".join([line(headers), rule, *(line(row) for row in rows)])


def parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the ``--short`` flag every benchmark accepts."""
    result = argparse.ArgumentParser(description=description)
    result.add_argument("--short", action="store_true", help="a smaller run for CI-size machines")
    return result


# ---- helper processes ---------------------------------------------------------------------------

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process ``pid`` so far, from /proc (all its threads)."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        fields = stat.read().rsplit(b")", 1)[1].split()
    # Fields 14 and 15 of proc(5), counted from the state field (3) after the command name.
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Child:
    """A helper process that printed the URL it listens on as the last word of a line."""

    process: subprocess.Popen[bytes]
    url: str

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def port(self) -> int:
        return int(self.url.rstrip("/").split(":")[-1].split("/")[0])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _die_with_parent() -> None:
    # PR_SET_PDEATHSIG: a benchmark killed outright must not leave its servers running.
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)


def start_child(
    argv: Sequence[str],
    marker: str,
    *,
    stderr: Any = subprocess.DEVNULL,
    source: str | None = None,
) -> Child:
    """Start ``argv`` and wait for its stdout line containing ``marker``; its last word is the
    URL the child listens on. ``source`` puts another copy of the package first on its path."""
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [source, env.get("PYTHONPATH")]))
    # Not the working directory: `python -m` puts it first on the path, ahead of ``source``.
    process = subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=stderr,
        env=env,
        cwd=Path(__file__).resolve().parent,
        preexec_fn=_die_with_parent,
    )
    assert process.stdout is not None
    for raw in process.stdout:
        line = raw.decode()
        if marker in line:
            return Child(process, line.split()[-1])
    process.wait()
    raise RuntimeError(f"{argv[0]} exited with {process.returncode} before listening")


def start_fake_judge(*extra: str) -> Child:
    """`genrm-trio fake-judge` over TCP in its own process (zero latency unless ``extra`` says)."""
    argv = [sys.executable, "-m", "genrm_trio.cli", "fake-judge", "--port", "0", *extra]
    return start_child(argv, "fake judge listening on")


def start_server(
    judge_url: str,
    group_size: int,
    sets: Sequence[str] = (),
    *extra: str,
    source: str | None = None,
) -> Child:
    """`genrm-trio serve` in its own process, on a free port, judged by ``judge_url``, with
    ``--set`` for each of ``sets`` and ``extra`` arguments; ``source`` as for ``start_child``."""
    argv = [sys.executable, "-m", "genrm_trio.cli", "serve", "--port", "0"]
    for setting in (
        f"judge_base_url={judge_url}",
        "judge_model=judge",
        f"num_rollouts_per_prompt={group_size}",
        *sets,
    ):
        argv += ["--set", setting]
    return start_child([*argv, *extra], "genrm-trio listening on", source=source)
