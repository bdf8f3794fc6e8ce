"""One real TRL `GRPOTrainer` training step with `GenRMRewardFunction` as its reward function,
against `genrm-trio serve` and the fake judge on loopback.

Opt-in: it needs torch and TRL (`pip install -e '.[trl]'`) and runs only with
GENRM_TRIO_TRL_TEST=1. The policy is a one-layer GPT-2 with a character-level tokenizer, both
built here, so nothing is downloaded. The fake judge scores a text without a quality directive
by its length (``1 + len % 5``), so the reward of every completion TRL sampled can be predicted
from its text; one judge call is told to fail, which masks two completions of one group. The
fake judge ignores the prompt, so the test reads the judge's recorded requests to see that each
group was judged under its own prompt.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import string
from pathlib import Path
from typing import Any

import pytest

from genrm_trio.client.trl import GenRMRewardFunction
from genrm_trio.core.texts import judge_answer_text
from genrm_trio.fakes.judge import quality

ENABLE = "GENRM_TRIO_TRL_TEST"


def _unimportable() -> str | None:
    """Why the trainer stack cannot be imported, or None. Importing `grpo_trainer` itself finds
    a missing dependency that TRL's lazy top-level import would only raise at first use."""
    for module in ("torch", "datasets", "pandas", "trl.trainer.grpo_trainer"):
        try:
            importlib.import_module(module)
        except ImportError as error:
            return f"{module}: {error}"
    return None


# Checked only when asked for, so that an ordinary run never pays torch's import.
if os.environ.get(ENABLE) != "1":
    pytest.skip(
        f"a real GRPOTrainer step on torch and TRL: pip install -e '.[trl]', then run with "
        f"{ENABLE}=1",
        allow_module_level=True,
    )
if (_reason := _unimportable()) is not None:
    pytest.skip(
        f"{ENABLE}=1 but the trainer stack does not import ({_reason}): pip install -e '.[trl]'",
        allow_module_level=True,
    )

N = 4  # GRPOConfig.num_generations and the server's num_rollouts_per_prompt
PROMPTS = ["what is 2+2?", "name a prime.", "spell cat.", "count to 3."]
CHARS = string.ascii_lowercase + string.digits + " ?.,+"


def tiny_tokenizer() -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(["[PAD]", "[EOS]", "[UNK]", *CHARS])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    # Character tokens join back without the spaces a WordLevel decode would put between them.
    tokenizer.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="[PAD]", eos_token="[EOS]", unk_token="[UNK]"
    )


def tiny_policy(tokenizer: Any) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=64,
        n_embd=32,
        n_layer=1,
        n_head=2,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return GPT2LMHeadModel(config)


def metric(text: str, name: str) -> dict[str, float]:
    """Samples of one Prometheus family, by their label text."""
    samples = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, _, value = line.removeprefix(name).rpartition(" ")
            samples[labels] = float(value)
    return samples


def test_one_grpo_trainer_step_is_rewarded_by_the_server_with_masked_completions_left_out(
    cli: Any, tmp_path: Path
) -> None:
    import pandas as pd
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    # The first comparison to reach the judge fails, whichever group it belongs to.
    rules = cli.write(
        "rules.json", json.dumps([{"action": "http_status", "status": 400, "times": 1}])
    )
    _, judge_url = cli.start_fake_judge("--rules", str(rules))
    settings = [
        f"judge_base_url={judge_url}",
        "judge_model=fake-judge",
        f"num_rollouts_per_prompt={N}",
        "genrm_parse_retries=0",
        "log_level=WARNING",
    ]
    _, url, _ = cli.start_serve(*(arg for s in settings for arg in ("--set", s)))

    reward = GenRMRewardFunction(url, num_generations=N, deadline_s=60)
    tokenizer = tiny_tokenizer()
    args = GRPOConfig(
        output_dir=str(tmp_path / "grpo"),
        max_steps=1,
        per_device_train_batch_size=2 * N,  # two prompts' groups per step
        num_generations=N,
        max_completion_length=8,
        # A completion that stops at once would be judged as the answer "None"; the step should
        # show rewards that vary with the sampled text.
        generation_kwargs={"min_new_tokens": 8},
        learning_rate=1e-3,
        use_cpu=True,
        bf16=False,
        report_to="none",
        logging_steps=1,
        log_completions=True,
        save_strategy="no",
        dataloader_num_workers=0,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=tiny_policy(tokenizer),
        reward_funcs=[reward],
        args=args,
        train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS]),
        processing_class=tokenizer,
    )
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    output = trainer.train()

    # The step ran and moved the policy.
    assert output.global_step == 1
    assert math.isfinite(output.training_loss)
    assert any(not p.detach().equal(before[name]) for name, p in trainer.model.named_parameters())

    # What TRL wrote for the step: per completion, its text, the reward and the advantage.
    table = pd.read_parquet(tmp_path / "grpo" / "completions" / "completions_00001.parquet")
    assert len(table) == 2 * N
    results = reward.last_results
    assert len(results) == 2 * N
    groups = [list(range(g * N, (g + 1) * N)) for g in range(2)]
    for rows in groups:
        assert len(set(table["prompt"].iloc[rows])) == 1
    masked = [i for i, r in enumerate(results) if r.mask_sample]
    # One failed comparison masks its two completions: neighbours in one group's circle.
    assert len(masked) == 2
    first, second = masked
    assert first // N == second // N
    assert (second - first) % N in (1, N - 1)
    for i, result in enumerate(results):
        logged = table["genrm"].iloc[i]
        if i in masked:
            assert result.reward is None
            assert "HTTP 400" in (result.failure_reason or "")
            assert math.isnan(logged)
            assert "lost a comparison to a judge failure" in table["genrm_failure"].iloc[i]
        else:
            # The judge saw the text TRL decoded; its reward is that text's quality.
            expected = quality(judge_answer_text(table["completion"].iloc[i]))
            assert result.reward == expected
            assert logged == expected
            assert table["genrm_failure"].iloc[i] == ""

    # TRL's logged means leave the masked completions out.
    scored = [r.reward for r in results if r.reward is not None]
    logs = next(entry for entry in trainer.state.log_history if "rewards/genrm/mean" in entry)
    assert logs["rewards/genrm/mean"] == pytest.approx(sum(scored) / len(scored))
    assert logs["reward"] == pytest.approx(sum(scored) / len(scored))
    assert logs["genrm/masked_fraction"] == pytest.approx(2 / (2 * N))
    # Each group is normalised over its scored completions alone (scale_rewards="group").
    for rows in groups:
        kept = [results[i].reward for i in rows if i not in masked]
        mean = sum(kept) / len(kept)
        std = math.sqrt(sum((r - mean) ** 2 for r in kept) / (len(kept) - 1))
        for i in rows:
            expected = 0.0 if i in masked else (results[i].reward - mean) / (std + 1e-4)
            assert table["advantage"].iloc[i] == pytest.approx(expected, abs=1e-4)

    # The server judged two groups of N, N comparisons each under circular pairing, and
    # answered every row: the failed comparison's two as masked.
    with cli.http_client(judge_url.removesuffix("/v1")) as http:
        assert http.get("/_fake/stats").json()["requests_total"] == 2 * N
        calls = http.get("/_fake/requests").json()
    # Each group's comparisons showed the judge that group's own prompt and its completions.
    for rows in groups:
        prompt = table["prompt"].iloc[rows[0]]
        texts = {judge_answer_text(table["completion"].iloc[i]) for i in rows}
        shown = []
        for call in calls:
            messages = {m["role"]: m["content"] for m in call["body"]["messages"]}
            if messages["user"] == prompt:
                shown.append({messages["response_1"], messages["response_2"]})
        assert len(shown) == N, (prompt, calls)
        assert all(pair <= texts for pair in shown)
    with cli.http_client(url) as http:
        exposition = http.get("/metrics").text
    rows_answered = metric(exposition, "genrm_verify_requests_total")
    assert rows_answered['{outcome="scored"}'] == 2 * N - 2
    assert rows_answered['{outcome="masked"}'] == 2
    comparisons = metric(exposition, "genrm_comparisons_total")
    assert comparisons['{outcome="verdict"}'] == 2 * N - 1
    assert comparisons['{outcome="failed"}'] == 1
