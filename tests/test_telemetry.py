"""The NVML sampler: summary and file of the recorded H200 series, and the no-GPU path.

The recorded series (tests/fixtures/h200_nvml_series.json) is real: gpu/nvml_series.py
sampled an H200 through idle and decode-attention load. The sampler itself is driven here by
a FAKE pynvml that replays that recording (tests/nvml_replay.py), since this machine has no
GPU; the real pynvml is used for the path every CPU machine takes (nvmlInit fails).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import threading

import pyarrow.parquet as pq
import pytest
from nvml_replay import ReplayNvml, recorded_series

from feather.telemetry import METRICS, NVML_FILE, NvmlSampler, sample_nvml, summarise
from feather.telemetry.series import series_table, write_series


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    rank = 0.95 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _present(rows: list[dict], metric: str) -> list[float]:
    return [float(r[metric]) for r in rows if not math.isnan(float(r[metric]))]


def test_summary_of_the_recorded_series_matches_its_samples(tmp_path) -> None:
    recording = recorded_series()
    rows = recording["samples"]
    assert recording["gpu"] == "NVIDIA H200" and len(rows) > 100
    table = series_table(rows)
    summary = summarise(table)
    assert list(summary) == [0]  # one GPU, index 0
    for metric in METRICS:
        values = _present(rows, metric)
        got = summary[0][metric]
        assert got["samples"] == len(values), metric
        assert got["mean"] == pytest.approx(statistics.fmean(values)), metric
        assert got["p95"] == pytest.approx(_p95(values)), metric
        assert got["max"] == max(values), metric
    # NVML's NaN readings are missing values, never zeros that would read as idle
    nan_dram = sum(math.isnan(r["gpm_dram_bw_util_pct"]) for r in rows)
    assert nan_dram > 0 and table.column("gpm_dram_bw_util_pct").null_count == nan_dram
    # what the recording shows: DRAM-bound decode drives the memory controller, shared does not
    unshared = series_table(r for r in rows if r["phase"] == "decode_unshared_800")
    shared = series_table(r for r in rows if r["phase"] == "decode_homog_800")
    mem = "mem_util_pct"
    assert summarise(unshared)[0][mem]["mean"] > 10 * summarise(shared)[0][mem]["mean"]

    path = write_series(tmp_path / NVML_FILE, table)
    assert pq.read_table(path).equals(table)
    assert [p.name for p in tmp_path.iterdir()] == [NVML_FILE]  # no temporary left behind


def test_sampler_writes_what_nvml_answered_in_order(tmp_path) -> None:
    rows = recorded_series()["samples"]
    fake = ReplayNvml(rows)
    twenty = fake.when_served(20)
    sampler = NvmlSampler(tmp_path / "replay" / NVML_FILE, interval_ms=1, nvml=fake)
    with sampler:
        assert twenty.wait(timeout=20), "the sampler took fewer than 20 samples in 20 s"
    table = pq.read_table(tmp_path / "replay" / NVML_FILE)
    served = fake.served + 1
    assert table.num_rows == served >= 20
    data = table.to_pydict()
    assert data["gpu"] == [0] * served
    assert data["t_s"] == sorted(data["t_s"])
    for i in range(served):
        want = rows[i % len(rows)]
        for metric in METRICS:
            if metric.startswith("gpm_") and i == 0:
                assert data[metric][0] is None  # a GPM rate needs two samples
                continue
            expected = None if math.isnan(float(want[metric])) else float(want[metric])
            assert data[metric][i] == pytest.approx(expected), (i, metric)
    record = sampler.record
    assert record["available"] is True and record["samples"] == served
    assert record["file"] == NVML_FILE and record["interval_ms"] == 1
    gpu = record["gpus"][0]
    assert gpu["name"] == "NVIDIA H200 (replayed recording)" and gpu["gpm_supported"] is True
    assert gpu["metrics"] == summarise(table)[0] and gpu["field_errors"] == {}
    assert fake.initialised == 0  # nvmlShutdown balanced nvmlInit
    assert not [t for t in threading.enumerate() if t.name == "feather-nvml"]


def test_a_counter_the_gpu_lacks_is_null_and_named_not_zero(tmp_path) -> None:
    fake = ReplayNvml(recorded_series()["samples"], unsupported=("pcie_tx_kbps",), gpm=False)
    done = fake.when_served(5)
    with NvmlSampler(tmp_path / NVML_FILE, interval_ms=1, nvml=fake) as sampler:
        assert done.wait(timeout=20)
    table = pq.read_table(tmp_path / NVML_FILE)
    assert table.column("pcie_tx_kbps").null_count == table.num_rows
    assert table.column("gpm_dram_bw_util_pct").null_count == table.num_rows
    assert table.column("pcie_rx_kbps").null_count == 0
    gpu = sampler.record["gpus"][0]
    assert gpu["field_errors"]["pcie_tx_kbps"].startswith("NVMLError_NotSupported")
    assert "not supported" in gpu["field_errors"]["gpm"]
    assert gpu["gpm_supported"] is False
    assert gpu["metrics"]["pcie_tx_kbps"] == {"mean": None, "p95": None, "max": None, "samples": 0}
    assert fake.calls["pcie_tx_kbps"] == 1  # asked once, then no more


def test_without_a_gpu_the_real_pynvml_path_records_why(tmp_path) -> None:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        expected = f"{type(exc).__name__}: {exc}"
    else:  # a machine with a GPU: the sampler must then sample it
        pynvml.nvmlShutdown()
        expected = None
    before = threading.active_count()
    with sample_nvml(tmp_path, interval_ms=10) as nvml:
        pass
    if expected is None:
        assert nvml.record["available"] is True and (tmp_path / NVML_FILE).is_file()
        return
    assert nvml.record == {"available": False, "applicable": True, "reason": expected}
    assert "LibraryNotFound" in expected or "Driver" in expected
    assert list(tmp_path.iterdir()) == []  # no file, no fake numbers
    assert threading.active_count() == before


def test_missing_library_and_turned_off_sampling_are_recorded(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml now raises ImportError
    with NvmlSampler() as sampler:
        pass
    assert sampler.record["available"] is False
    assert "nvidia-ml-py is not installed" in sampler.record["reason"]
    monkeypatch.setenv("FEATHER_NVML_INTERVAL_MS", "0")
    fake = ReplayNvml(recorded_series()["samples"])
    with NvmlSampler(nvml=fake) as off:
        pass
    assert off.record["reason"] == "sampling turned off (FEATHER_NVML_INTERVAL_MS=0)"
    assert fake.served == -1 and fake.initialised == 0  # NVML was not even started


def test_the_command_wrapper_samples_around_a_command_and_keeps_its_status(tmp_path) -> None:
    from feather.telemetry.__main__ import main

    code = "import sys; print('benchmark ran'); sys.exit(3)"
    status = main(["sample", "--out", str(tmp_path), "--", sys.executable, "-c", code])
    assert status == 3
    written = json.loads((tmp_path / "nvml.json").read_text())
    assert written["returncode"] == 3 and written["command"][-1] == code
    assert written["provenance"]["command"] == written["command"]
    assert written["nvml"]["available"] is (tmp_path / NVML_FILE).is_file()


def test_without_pyarrow_the_counters_are_still_summarised(tmp_path, monkeypatch) -> None:
    """A bare GPU box may lack pyarrow: the record keeps the summary and says why no file."""
    rows = recorded_series()["samples"]
    fake = ReplayNvml(rows)
    done = fake.when_served(5)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # `import pyarrow` now fails
    with NvmlSampler(tmp_path / NVML_FILE, interval_ms=1, nvml=fake) as sampler:
        assert done.wait(timeout=20)
    record = sampler.record
    assert record["available"] is True and record["file"] is None
    assert "series not written" in record["file_error"] and "pyarrow" in record["file_error"]
    assert list(tmp_path.iterdir()) == []
    served = [rows[i] for i in range(fake.served + 1)]
    sm = record["gpus"][0]["metrics"]["sm_util_pct"]
    assert sm["samples"] == len(served)
    assert sm["mean"] == pytest.approx(statistics.fmean(r["sm_util_pct"] for r in served))
