"""`feather bench kernels` and gpu/kernels.sh's script, run for real on tiny shapes (CPU).

No timings are asserted (they live in the benchmark's output); what is asserted is the
document's shape, that bytes and checks are consistent, the ratios' arithmetic, and that the
GPU script's CPU dry run writes every file, drives ncu as intended (a fake ncu here) and
folds its metrics into the calibration file.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from feather.bench import kernels as bench
from feather.cli import main as cli_main
from feather.kernels.plan import KERNELS

os.environ["TRITON_INTERPRET"] = "1"  # the dry run's Triton kernels, on this CPU
REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "gpu" / "kernel_bench.py"


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kernel_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("kernel_bench", module)
    spec.loader.exec_module(module)
    return module


script = _load_script()


def test_cli_quick_run_writes_a_consistent_document(tmp_path: Path, capsys) -> None:
    out = tmp_path / "k.json"
    rc = cli_main(
        ["bench", "kernels", "--quick", "--benchmarks", "c1,c2,c7", "--out", str(out), "--quiet"]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "scale: quick" in printed and "C1 (per kernel)" in printed
    doc = json.loads(out.read_text())
    assert doc["schema"] == bench.SCHEMA and doc["device"] == "cpu"
    assert doc["provenance"]["seed"] == 0 and "git" in doc["provenance"]
    assert doc["provenance"]["config"]["cpu_threads"] == 1
    configs = {r["config"] for r in doc["rows"]}
    assert configs == {
        "homog_2",
        "mixed_2",
        "mixed_16",
        "homog_4_div0",
        "homog_4_div1",
        "nested_16",
    }
    for config in configs:
        rows = {r["kernel"]: r for r in doc["rows"] if r["config"] == config}
        assert set(rows) == set(KERNELS)
        for r in rows.values():
            assert r["check_ok"] and r["median_s"] > 0 and len(r["times_s"]) == r["repeats"]
            assert r["bytes"]["total"] == sum(v for k, v in r["bytes"].items() if k != "total")
        # by construction: paged reads everything, pat each node once, cascade in between
        assert rows["paged"]["bytes"]["kv"] == rows["paged"]["logical_kv_bytes"]
        assert rows["pat"]["bytes"]["kv"] == rows["pat"]["unique_kv_bytes"]
        assert rows["pat"]["bytes"]["kv"] <= rows["cascade"]["bytes"]["kv"]
        assert rows["cascade"]["bytes"]["kv"] <= rows["paged"]["bytes"]["kv"]
    homog = {r["kernel"]: r["bytes"]["kv"] for r in doc["rows"] if r["config"] == "homog_4_div0"}
    one_div = {r["kernel"]: r["bytes"]["kv"] for r in doc["rows"] if r["config"] == "homog_4_div1"}
    assert homog["cascade"] < homog["paged"] and one_div["cascade"] == one_div["paged"]
    assert one_div["pat"] < one_div["paged"]
    assert {e["kernel"] for e in doc["summary"]["c1"]} == set(KERNELS)
    assert [e["divergent"] for e in doc["summary"]["c2"]] == [1, 1, 1]


def _row(config: str, kernel: str, median_s: float) -> dict:
    return {"config": config, "kernel": kernel, "implementation": "torch", "median_s": median_s}


def test_summary_ratios_by_hand() -> None:
    sweep = bench.SWEEPS["quick"]  # per_group 2, c2 batch 4, divergent (0, 1)
    rows = []
    for kernel, (homog, mixed, big, div0, div1) in {
        "paged": (1.0, 1.0, 8.0, 2.0, 2.0),
        "cascade": (0.5, 1.0, 8.0, 1.0, 2.0),
        "pat": (0.5, 0.8, 2.0, 1.0, 1.5),
    }.items():
        rows += [
            _row("homog_2", kernel, homog),
            _row("mixed_2", kernel, mixed),
            _row("mixed_16", kernel, big),
            _row("homog_4_div0", kernel, div0),
            _row("homog_4_div1", kernel, div1),
        ]
    got = bench.summarise(rows, sweep)
    c1 = {e["kernel"]: e for e in got["c1"]}
    assert c1["cascade"]["mixed_over_homog_equal_size"] == pytest.approx(2.0)
    # homog: 2 requests in 0.5 s = 4/s; mixed 16 in 2 s = 8/s -> 0.5
    assert c1["pat"]["homog_throughput_over_mixed_big"] == pytest.approx(0.5)
    assert c1["paged"]["homog_throughput_over_mixed_big"] == pytest.approx(1.0)  # 2/s, 2/s
    c2 = {e["kernel"]: e["slowdown"] for e in got["c2"]}
    assert c2 == pytest.approx({"paged": 1.0, "cascade": 2.0, "pat": 1.5})
    c7 = {e["config"]: e for e in got["c7"]}
    assert c7["mixed_16"]["paged_over_pat"] == pytest.approx(4.0)
    assert c7["homog_2"]["paged_over_cascade"] == pytest.approx(2.0)


def test_default_sweep_shapes() -> None:
    shapes = bench.model_shapes()
    assert (shapes.q_heads, shapes.kv_heads, shapes.head_dim) == (32, 8, 128)
    batches = dict(
        (b.name, (name, b)) for name, b in bench.SWEEPS["default"].batches(shapes.block_size)
    )
    assert batches["mixed_128"][1].groups == 8 and batches["mixed_128"][1].num_seqs == 128
    assert batches["homog_16"][1].groups == 1
    assert [n for n in batches if n.startswith("homog_8_p")] == [
        f"homog_8_p{p}" for p in (1024, 2048, 4096, 8192, 16384)
    ]
    assert batches["homog_32_div16"][1].divergent == 16
    full = {b.name for _, b in bench.SWEEPS["full"].batches(16)}
    assert {"homog_100", "mixed_100", "mixed_800", "nested_800"} <= full
    with pytest.raises(ValueError, match="unknown benchmarks"):
        bench.select_sweep("default", ("c9",), None)


def test_combine_launches_weights_hit_rate_by_sectors() -> None:
    launches = [
        {
            "metrics": {
                "dram__bytes_read.sum": 100.0,
                "lts__t_sector_hit_rate.pct": 90.0,
                "lts__t_sectors_srcunit_tex_op_read.sum": 30.0,
            }
        },
        {
            "metrics": {
                "dram__bytes_read.sum": 50.0,
                "lts__t_sector_hit_rate.pct": 50.0,
                "lts__t_sectors_srcunit_tex_op_read.sum": 10.0,
            }
        },
    ]
    got = script.combine_launches(launches)
    assert got["dram__bytes_read.sum"] == 150.0
    assert got["lts__t_sector_hit_rate.pct"] == pytest.approx(80.0)
    assert script.combine_launches([]) == {}


def test_ncu_child_runs_one_step_in_process(capsys) -> None:
    for kernel in ("paged", "pat"):  # the plain kernel, and the segment kernel
        argv = [
            "--ncu-child",
            "--device",
            "cpu",
            "--quick",
            "--config",
            "mixed_16",
            "--kernel",
            kernel,
        ]
        assert script.main(argv) == 0
        assert f"ncu-child mixed_16 {kernel}: done" in capsys.readouterr().out


NCU_CSV = (
    '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n'
    '"0","_segment_decode_kernel","dram__bytes_read.sum","byte","1,000"\n'
    '"0","_segment_decode_kernel","lts__t_sector_hit_rate.pct","%","75"\n'
)


def _fake_ncu(tmp_path: Path) -> Path:
    """Answers --version and --query-metrics; for a profile, logs its argv and prints CSV."""
    log = tmp_path / "ncu_calls.jsonl"
    path = tmp_path / "ncu"
    path.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        "if sys.argv[1] in ('--version', '--query-metrics'):\n"
        "    print('fake ncu 0.0'); sys.exit(0)\n"
        f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        f"sys.stdout.write({NCU_CSV!r})\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_gpu_script_dry_run_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "out"
    fake = _fake_ncu(tmp_path)
    run = subprocess.run(
        [
            "bash",
            str(REPO / "gpu" / "kernels.sh"),
            str(out),
            "--device",
            "cpu",
            "--quick",
            "--benchmarks",
            "c1",
            "--ncu",
            str(fake),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert {p.name for p in out.iterdir()} >= {
        "kernels.json",
        "ncu.json",
        "kernel-calibration-cpu.json",
        "log.txt",
        "run_state.json",
    }
    doc = json.loads((out / "kernels.json").read_text())
    assert {r["implementation"] for r in doc["rows"]} == {"torch", "triton"}
    assert all(r["check_ok"] for r in doc["rows"]) and doc["nvml"]["sampler"]
    ncu = json.loads((out / "ncu.json").read_text())
    assert len(ncu["runs"]) == 3 * len(KERNELS)  # homog_2, mixed_2, mixed_16 x kernels
    calls = [json.loads(x) for x in (tmp_path / "ncu_calls.jsonl").read_text().splitlines()]
    for argv, record in zip(calls, ncu["runs"], strict=True):
        skip = argv[argv.index("--launch-skip") + 1]
        assert skip == argv[argv.index("--launch-count") + 1] == str(record["expected_launches"])
        assert argv[argv.index("--kernel") + 1] == record["kernel"]
        assert record["summary"]["dram_read_bytes"] == 1000.0
    # pat on a mixed batch launches twice a step (shared nodes, then private leaves)
    pat_mixed = next(r for r in ncu["runs"] if (r["config"], r["kernel"]) == ("mixed_16", "pat"))
    assert pat_mixed["expected_launches"] == 2
    cal = json.loads((out / "kernel-calibration-cpu.json").read_text())
    assert cal["ncu_available"] and len(cal["entries"]) == 3 * len(KERNELS)
    assert all(e["ncu"]["l2_hit_rate_pct"] == 75.0 for e in cal["entries"])
    assert "wrote" in (out / "log.txt").read_text()


def test_bare_gpu_box_fallbacks(tmp_path: Path, monkeypatch) -> None:
    """Without pyarrow (so without feather.telemetry / feather.provenance) the script still
    samples through gpu/l2_probe.py's sampler and writes a reduced provenance record."""
    monkeypatch.setitem(sys.modules, "feather.telemetry.nvml", None)  # import -> ImportError
    monkeypatch.setitem(sys.modules, "feather.provenance", None)
    record: dict = {}
    with script.nvml_sampling(tmp_path, script._load_probe(), record):
        pass
    assert record["sampler"].startswith("gpu/l2_probe.py") and record["available"] is False
    got = bench._provenance(config={"a": 1}, seed=3)
    assert got["error"].startswith("feather.provenance unavailable") and got["seed"] == 3


def test_kernel_bench_finds_what_it_uses_in_the_probe() -> None:
    """Every `probe.<name>` gpu/kernel_bench.py reads exists on the probe it loads, in a fresh
    interpreter where gpu/ is not on sys.path and both scripts are loaded by path (as the tests
    load them): the probe's parts live in gpu/l2_probe_*.py and it must still find them."""
    tree = ast.parse(SCRIPT.read_text())
    used = sorted(
        {
            node.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "probe"
        }
    )
    assert {"ncu_args", "run_bounded", "parse_ncu_csv", "start_watchdog", "NvmlSampler"} <= set(
        used
    )
    code = (
        "import importlib.util, json, sys\n"
        f"assert {str(SCRIPT.parent)!r} not in sys.path\n"
        f"spec = importlib.util.spec_from_file_location('kernel_bench', {str(SCRIPT)!r})\n"
        "bench = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(bench)\n"
        "probe = bench._load_probe()\n"
        f"print(json.dumps([name for name in {used!r} if not hasattr(probe, name)]))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout) == []
