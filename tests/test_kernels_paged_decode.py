"""Paged decode kernels and the L2 probe's CPU-testable logic.

Three layers, each skipping only what its environment lacks:
- pure Python (always run): the probe's configuration builders (block tables, lengths), byte
  accounting, summaries, Nsight Compute CSV parsing and the ncu subprocess plumbing (with a
  fake `ncu`);
- torch (skipped without it): the PyTorch reference against a dense float64 computation;
- torch + triton (skipped without them): the Triton kernel against the reference under
  Triton's CPU interpreter (TRITON_INTERPRET=1, set here before triton is imported), and an
  end-to-end `--cpu-smoke` run of gpu/l2_probe.py.
The repository's CI does not install torch yet, so there only the pure-Python tests run.
Triton 3.6's interpreter needs numpy < 2.4 (it converts 1-element arrays with int()); 3.9's
works with numpy 2.4.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import random
import stat
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

os.environ["TRITON_INTERPRET"] = "1"  # must precede any import of triton

REPO = Path(__file__).resolve().parents[1]
PROBE_PATH = REPO / "gpu" / "l2_probe.py"


def _load_probe() -> ModuleType:
    spec = importlib.util.spec_from_file_location("l2_probe", PROBE_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["l2_probe"] = module
    spec.loader.exec_module(module)
    return module


probe = _load_probe()
# Loaded by path, the probe puts gpu/ on sys.path and imports its parts by name: these are the
# very modules it uses.
configs = importlib.import_module("l2_probe_configs")
bookkeeping = importlib.import_module("l2_probe_bookkeeping")
device = importlib.import_module("l2_probe_device")
ncu_plumbing = importlib.import_module("l2_probe_ncu")
FULL = configs.FULL_SHAPES
TOKEN_BYTES_FULL = 2 * 8 * 128 * 2  # K and V, 8 KV heads, head_dim 128, bf16


# ---------------------------------------------------------------------------------------------
# Configuration builders
# ---------------------------------------------------------------------------------------------


def _shared_prefix_len(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _check_pool(cfg) -> None:
    """Every id in the pool is used, every table long enough for its sequence."""
    used = {b for t in cfg.block_tables for b in t}
    assert used == set(range(cfg.num_blocks))
    for table, seq_len in zip(cfg.block_tables, cfg.seq_lens, strict=True):
        assert len(table) == math.ceil(seq_len / FULL.block_size)


def test_homog_100_shares_full_prefix_blocks_only() -> None:
    cfg = configs.build_config("homog_100")
    shared = FULL.prefix_tokens // FULL.block_size  # 243 full blocks; 12 prefix tokens private
    assert shared == 243
    assert cfg.num_seqs == 100 and set(cfg.seq_lens) == {4000} and set(cfg.groups) == {0}
    _check_pool(cfg)
    first = cfg.block_tables[0]
    for table in cfg.block_tables[1:]:
        assert table[:shared] == first[:shared]
    private = [b for t in cfg.block_tables for b in t[shared:]]
    assert len(private) == len(set(private)) == 100 * 7
    assert cfg.num_blocks == 243 + 700


def test_mixed_800_shuffled_and_grouped_hold_the_same_groups() -> None:
    shuffled = configs.build_config("mixed_800")
    grouped = configs.build_config("mixed_800_grouped")
    for cfg in (shuffled, grouped):
        assert cfg.num_seqs == 800 and cfg.num_blocks == 8 * (243 + 700)
        _check_pool(cfg)
        by_group: dict[int, set[tuple[int, ...]]] = {}
        for table, group in zip(cfg.block_tables, cfg.groups, strict=True):
            by_group.setdefault(group, set()).add(tuple(table[:243]))
        assert sorted(by_group) == list(range(8))
        prefixes = [next(iter(p)) for p in by_group.values()]
        assert all(len(p) == 1 for p in by_group.values())  # one prefix per group
        assert len({b for p in prefixes for b in p}) == 8 * 243  # disjoint across groups
    assert grouped.groups == sorted(grouped.groups)
    assert shuffled.groups != grouped.groups
    assert sorted(map(tuple, shuffled.block_tables)) == sorted(map(tuple, grouped.block_tables))
    runs = sum(1 for a, b in zip(shuffled.groups, shuffled.groups[1:], strict=False) if a != b)
    assert runs > 400  # really interleaved
    assert configs.build_config("mixed_800").block_tables == shuffled.block_tables  # seeded


def test_mixed_100_groups_of_12_and_13() -> None:
    cfg = configs.build_config("mixed_100")
    _check_pool(cfg)
    sizes = sorted(cfg.groups.count(g) for g in range(8))
    assert sizes == [12, 12, 12, 12, 13, 13, 13, 13]
    assert configs.split_evenly(100, 8) == [13, 13, 13, 13, 12, 12, 12, 12]
    assert cfg.groups != sorted(cfg.groups)


def test_homog_100_1div_has_one_unshared_sequence() -> None:
    cfg = configs.build_config("homog_100_1div")
    _check_pool(cfg)
    assert cfg.num_seqs == 100 and cfg.groups.count(-1) == 1
    div = cfg.groups.index(-1)
    assert str(div) in cfg.description
    others = [t for i, t in enumerate(cfg.block_tables) if i != div]
    assert all(t[:243] == others[0][:243] for t in others)
    assert not set(cfg.block_tables[div]) & {b for t in others for b in t}
    assert cfg.seq_lens[div] == 4000 and len(cfg.block_tables[div]) == 250


@pytest.mark.parametrize("name,count", [("unshared_100", 100), ("unshared_800", 800)])
def test_unshared_configs_share_nothing(name: str, count: int) -> None:
    cfg = configs.build_config(name)
    _check_pool(cfg)
    assert cfg.num_seqs == count and set(cfg.groups) == {-1}
    assert cfg.num_blocks == count * 250
    assert configs.logical_kv_bytes(cfg, FULL) == configs.unique_kv_bytes(cfg, FULL)


def test_byte_accounting_full_shapes() -> None:
    assert FULL.kv_bytes_per_token == TOKEN_BYTES_FULL
    homog = configs.build_config("homog_100")
    assert configs.logical_kv_bytes(homog, FULL) == 100 * 4000 * TOKEN_BYTES_FULL
    # 243 shared blocks once + each sequence's 112 own tokens (12 prefix tail + 100)
    assert configs.unique_kv_bytes(homog, FULL) == (243 * 16 + 100 * 112) * TOKEN_BYTES_FULL
    mixed = configs.build_config("mixed_800")
    assert configs.logical_kv_bytes(mixed, FULL) == 800 * 4000 * TOKEN_BYTES_FULL
    assert configs.unique_kv_bytes(mixed, FULL) == 8 * configs.unique_kv_bytes(homog, FULL)
    desc = configs.describe_config(homog, FULL)
    assert desc["programs"] == 800 and desc["max_blocks"] == 250
    assert desc["group_sizes"] == {"0": 100}


def test_unique_bytes_count_partial_blocks_once() -> None:
    shapes = configs.SMOKE_SHAPES  # block 4, 30-token prefix (7 full blocks), 35-token sequences
    cfg = configs.build_config("homog_100", shapes)
    per_token = shapes.kv_bytes_per_token
    own_tokens = 35 - 7 * 4  # 7: 2 prefix tail + 5 own, in 2 blocks (4 + 3)
    assert configs.unique_kv_bytes(cfg, shapes) == (7 * 4 + 8 * own_tokens) * per_token
    padded = cfg.padded_tables()
    assert {len(r) for r in padded} == {cfg.max_blocks}


def test_unknown_config_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown config"):
        configs.build_config("nope")


# ---------------------------------------------------------------------------------------------
# Bookkeeping
# ---------------------------------------------------------------------------------------------


def test_summaries() -> None:
    times = bookkeeping.summarise_times([3.0, 1.0, 2.0, 10.0, 4.0])
    assert times["median_ms"] == 3.0 and times["min_ms"] == 1.0 and times["max_ms"] == 10.0
    bw = bookkeeping.bandwidth_summary(4_000_000_000, 1_000_000_000, 1.0, 4e12)
    assert bw["effective_bytes_per_s"] == pytest.approx(4e12)
    assert bw["ratio_to_copy"] == pytest.approx(1.0)
    assert bw["unique_ratio_to_copy"] == pytest.approx(0.25)
    assert bookkeeping.bandwidth_summary(1, 1, 1.0, None)["ratio_to_copy"] is None
    samples = [
        {"t_s": 0.0, "mem_util_pct": 50.0, "power_w": None},
        {"t_s": 0.02, "mem_util_pct": 70.0, "power_w": None},
    ]
    got = device.summarise_samples(samples)
    assert got["samples"] == 2
    assert got["mem_util_pct"] == {"mean": 60.0, "max": 70.0, "n": 2}
    assert got["power_w"] is None and "t_s" not in got


def test_budget_and_results_file(tmp_path: Path) -> None:
    budget = bookkeeping.Budget(start_s=0.0, total_s=1e12)
    assert budget.before(1e12) and budget.remaining() > 0
    assert not bookkeeping.Budget(start_s=-100.0, total_s=50.0).before(50.0)
    results = bookkeeping.Results(tmp_path / "sub" / "r.json", {"configs": {}})
    results.write()
    assert "elapsed_s" in json.loads((tmp_path / "sub" / "r.json").read_text())
    assert not list(tmp_path.glob("sub/*.tmp"))


def test_resident_programs_per_sm() -> None:
    # the bf16 kernel as Triton 3.6 builds it for sm_90 (104 registers, 39 KB shared, 4 warps)
    assert device.resident_programs_per_sm(104, 39168, 4) == 4  # registers bind
    assert device.resident_programs_per_sm(255, 0, 4) == 2
    assert device.resident_programs_per_sm(32, 100_000, 4) == 2  # shared memory binds
    assert device.resident_programs_per_sm(16, 0, 1) == 32  # CTA slots bind


def test_watchdog_saves_results_and_exits_124(tmp_path: Path) -> None:
    script = (
        "import importlib.util, sys, time\n"
        f"spec = importlib.util.spec_from_file_location('l2_probe', {str(PROBE_PATH)!r})\n"
        "m = importlib.util.module_from_spec(spec); sys.modules['l2_probe'] = m\n"
        "spec.loader.exec_module(m)\n"
        f"r = m.Results(m.Path({str(tmp_path / 'r.json')!r}), {{'errors': []}})\n"
        "m.start_watchdog(r, deadline_s=0.5)\n"
        "time.sleep(30)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert run.returncode == 124, run.stderr
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["watchdog_fired"] and data["errors"][0]["stage"] == "watchdog"


def test_format_table_tolerates_partial_records() -> None:
    data = {
        "configs": {
            "homog_100": {"structure": {"num_seqs": 100, "logical_kv_bytes": 1.6e9}},
            "mixed_800": {"error": "RuntimeError: boom"},
        },
        "ncu": {"runs": {"homog_100": {"summary": {"l2_hit_rate_pct": 90.0}}}},
    }
    table = bookkeeping.format_table(data)
    assert "homog_100" in table and "90.0" in table and "ERROR RuntimeError: boom" in table


NCU_CSV = """\
==PROF== Connected to process 4242 (/usr/bin/python3.12)
==PROF== Profiling "_paged_decode_kernel" - 0: 0%....50%....100% - 3 passes
ncu-mode homog_100: done
==PROF== Disconnected from process 4242
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",\
"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","4242","python3.12","127.0.0.1","_paged_decode_kernel","1","7","(128, 1, 1)","(100, 8, 1)",\
"0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","123,456,789"
"0","4242","python3.12","127.0.0.1","_paged_decode_kernel","1","7","(128, 1, 1)","(100, 8, 1)",\
"0","9.0","Command line profiler metrics","lts__t_sector_hit_rate.pct","%","92.5"
"0","4242","python3.12","127.0.0.1","_paged_decode_kernel","1","7","(128, 1, 1)","(100, 8, 1)",\
"0","9.0","Command line profiler metrics","lts__t_sectors_srcunit_tex_op_read.sum","Msector","2.5"
"""


def test_parse_ncu_csv_skips_program_output_and_scales_units() -> None:
    launches = ncu_plumbing.parse_ncu_csv(NCU_CSV)
    assert len(launches) == 1
    got = launches[0]
    assert got["kernel"] == "_paged_decode_kernel"
    assert got["metrics"]["dram__bytes_read.sum"] == 123_456_789
    assert got["metrics"]["lts__t_sector_hit_rate.pct"] == 92.5
    assert got["metrics"]["lts__t_sectors_srcunit_tex_op_read.sum"] == 2.5e6
    assert ncu_plumbing.parse_ncu_csv("==ERROR== ERR_NVGPUCTRPERM - no permission\n") == []


def test_ncu_summary_reuse() -> None:
    metrics = {"dram__bytes_read.sum": 300.0, "lts__t_sector_hit_rate.pct": 80.0}
    got = ncu_plumbing.ncu_summary(metrics, logical=1000, unique=100)
    assert got["dram_over_logical"] == pytest.approx(0.3)
    assert got["dram_over_unique"] == pytest.approx(3.0)
    assert got["reuse_captured"] == pytest.approx(700 / 900)
    assert ncu_plumbing.ncu_summary(metrics, logical=100, unique=100)["reuse_captured"] is None
    assert ncu_plumbing.ncu_summary({}, 1, 1)["dram_read_bytes"] is None


def _fake_ncu(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "ncu"
    path.write_text(f"#!{sys.executable}\nimport sys, time\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_run_ncu_for_config_builds_the_command_and_parses(tmp_path: Path) -> None:
    argv_file = tmp_path / "argv.json"
    fake = _fake_ncu(
        tmp_path,
        f"import json\njson.dump(sys.argv[1:], open({str(argv_file)!r}, 'w'))\n"
        f"sys.stdout.write({NCU_CSV!r})",
    )
    record = probe.run_ncu_for_config(
        str(fake), ["a.sum", "b.pct"], "mixed_800", "_paged_decode_kernel", 30.0, False, 1000, 100
    )
    argv = json.loads(argv_file.read_text())
    assert argv[argv.index("--metrics") + 1] == "a.sum,b.pct"
    assert argv[argv.index("--kernel-name") + 1] == "regex:_paged_decode_kernel"
    assert argv[argv.index("--launch-skip") + 1] == "1"
    assert argv[argv.index("--launch-count") + 1] == "1"
    assert argv[argv.index("--cache-control") + 1] == "all"
    assert "--csv" in argv and argv[-3:] == ["--config", "mixed_800", "--ncu-mode"]
    assert argv[argv.index("--config") - 1] == str(PROBE_PATH)
    assert record["rc"] == 0 and "error" not in record
    assert record["summary"]["dram_read_bytes"] == 123_456_789


def test_run_ncu_for_config_records_permission_error(tmp_path: Path) -> None:
    fake = _fake_ncu(
        tmp_path,
        "print('==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access "
        "NVIDIA GPU Performance Counters')\nsys.exit(1)",
    )
    record = probe.run_ncu_for_config(str(fake), ["x.sum"], "homog_100", "k", 30.0, False, 1, 1)
    assert record["rc"] == 1 and record["error"] == "no metrics in ncu output"
    assert any("ERR_NVGPUCTRPERM" in line for line in record["error_lines"])


def test_run_ncu_for_config_times_out(tmp_path: Path) -> None:
    fake = _fake_ncu(tmp_path, "time.sleep(60)")
    record = probe.run_ncu_for_config(str(fake), ["x.sum"], "homog_100", "k", 1.0, False, 1, 1)
    assert record["timed_out"] and record["error"] == "timed out"
    assert record["wall_s"] < 30


def test_ncu_metric_query_keeps_listed_optional_metrics(tmp_path: Path) -> None:
    fake = _fake_ncu(tmp_path, "print('gpu__time_duration  Counter  ns  duration')")
    got = ncu_plumbing.ncu_available_metrics(str(fake), 30.0)
    assert got["metrics"] == [*ncu_plumbing.NCU_METRICS_REQUIRED, "gpu__time_duration.sum"]
    failing = _fake_ncu(tmp_path, "print('gpu__time_duration'); sys.exit(3)")
    assert ncu_plumbing.ncu_available_metrics(str(failing), 30.0)["metrics"] == list(
        ncu_plumbing.NCU_METRICS_REQUIRED
    )


# ---------------------------------------------------------------------------------------------
# Kernels (torch; triton under its interpreter)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def kernels(torch):
    from feather.kernels import paged_decode

    return paged_decode


@pytest.fixture(scope="module")
def triton_interp(kernels):
    pytest.importorskip("triton")
    pytest.importorskip("numpy")  # Triton's interpreter runs on numpy
    return kernels


def _case(
    torch,
    seed: int,
    dtype,
    *,
    num_seqs: int,
    q_heads: int,
    kv_heads: int,
    head_dim: int,
    block_size: int,
    share: bool,
    lens: list[int] | None = None,
):
    """Random paged inputs; with `share`, sequences reuse a common run of physical blocks."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    if lens is None:
        lens = [rng.randint(1, 5 * block_size + 3) for _ in range(num_seqs)]
    max_blocks = max(math.ceil(n / block_size) for n in lens)
    num_blocks = (num_seqs + 1) * max_blocks + 3  # the common run + every private block
    tables = []
    common = rng.sample(range(num_blocks), max_blocks)
    pool = [b for b in range(num_blocks) if b not in common]
    rng.shuffle(pool)
    for n in lens:
        need = math.ceil(n / block_size)
        shared = rng.randint(0, need) if share else 0
        row = common[:shared] + [pool.pop() for _ in range(need - shared)]
        row += [rng.randrange(num_blocks) for _ in range(max_blocks - need)]  # junk padding
        tables.append(row)
    q = torch.randn(num_seqs, q_heads, head_dim, generator=gen).to(dtype)
    k = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    bt = torch.tensor(tables, dtype=torch.int32)
    sl = torch.tensor(lens, dtype=torch.int32)
    return q, k, v, bt, sl


def _dense(torch, q, k, v, bt, sl, scale):
    """Token-by-token gather, repeat_interleave over heads, plain softmax: float64."""
    num_seqs, q_heads, head_dim = q.shape
    block_size, kv_heads = k.shape[1], k.shape[2]
    out = torch.zeros(num_seqs, q_heads, head_dim, dtype=torch.float64)
    for s in range(num_seqs):
        n = int(sl[s])
        if n == 0:
            continue
        rows_k = [k[int(bt[s, t // block_size]), t % block_size] for t in range(n)]
        rows_v = [v[int(bt[s, t // block_size]), t % block_size] for t in range(n)]
        ks = torch.stack(rows_k).double().repeat_interleave(q_heads // kv_heads, dim=1)
        vs = torch.stack(rows_v).double().repeat_interleave(q_heads // kv_heads, dim=1)
        qs = q[s].double()
        att = torch.softmax(torch.einsum("hd,thd->ht", qs, ks) * scale, dim=-1)
        out[s] = torch.einsum("ht,thd->hd", att, vs)
    return out


SHAPES = [  # (num_seqs, q_heads, kv_heads, head_dim, block_size, share)
    (1, 4, 4, 16, 4, False),  # one sequence, no GQA
    (3, 8, 2, 16, 4, True),  # GQA 4, shared blocks
    (4, 6, 2, 32, 8, True),  # GQA 3 (group not a power of two)
    (5, 16, 2, 16, 16, False),  # GQA 8, one block per tile
    (2, 2, 1, 64, 2, True),  # tiny blocks: many blocks per tile
]


@pytest.mark.parametrize("shape", SHAPES)
def test_reference_matches_dense_float64(torch, kernels, shape) -> None:
    num_seqs, q_heads, kv_heads, head_dim, block_size, share = shape
    q, k, v, bt, sl = _case(
        torch,
        7,
        torch.float32,
        num_seqs=num_seqs,
        q_heads=q_heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        share=share,
    )
    scale = kernels.default_scale(head_dim)
    want = _dense(torch, q, k, v, bt, sl, scale)
    got = kernels.paged_decode_reference(q, k, v, bt, sl, scale)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    small_chunks = kernels.paged_decode_reference(q, k, v, bt, sl, scale, chunk_tokens=1)
    torch.testing.assert_close(small_chunks, want, rtol=1e-10, atol=1e-12)


def test_reference_rejects_bad_shapes(torch, kernels) -> None:
    q = torch.randn(2, 3, 16)
    k = torch.randn(4, 4, 2, 16)
    with pytest.raises(ValueError, match="multiple"):
        kernels.paged_decode_reference(
            q, k, k, torch.zeros(2, 1, dtype=torch.int32), torch.ones(2, dtype=torch.int32), 1.0
        )


def _run_triton(torch, kernels, q, k, v, bt, sl, scale):
    out = torch.full_like(q, float("nan"))  # poisoned: an unwritten element fails
    got = kernels.paged_decode_triton(q, k, v, bt, sl, scale, out=out)
    assert got is out
    return out


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16", "float16"])
def test_triton_matches_reference_interpreted(torch, triton_interp, shape, dtype_name) -> None:
    num_seqs, q_heads, kv_heads, head_dim, block_size, share = shape
    dtype = getattr(torch, dtype_name)
    seed = 10 * SHAPES.index(shape) + ["float32", "bfloat16", "float16"].index(dtype_name)
    q, k, v, bt, sl = _case(
        torch,
        seed,
        dtype,
        num_seqs=num_seqs,
        q_heads=q_heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        share=share,
    )
    scale = triton_interp.default_scale(head_dim)
    ref = triton_interp.paged_decode_reference(q, k, v, bt, sl, scale)
    out = _run_triton(torch, triton_interp, q, k, v, bt, sl, scale)
    assert out.dtype == dtype and bool(torch.isfinite(out).all())
    tol = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 3e-3}[dtype_name]
    rel = (torch.linalg.vector_norm(out.double() - ref) / torch.linalg.vector_norm(ref)).item()
    assert rel < tol
    torch.testing.assert_close(out.double(), ref, rtol=tol * 4, atol=tol * 4)


def test_triton_partial_and_exact_blocks_and_empty_sequence(torch, triton_interp) -> None:
    """Lengths at, just past and just before block and tile edges; a zero length gives 0."""
    block_size = 4
    tile = triton_interp.tile_tokens_for(block_size)
    lens = [1, block_size, block_size + 1, tile - 1, tile, tile + 1, 2 * tile + 3, 0]
    q, k, v, bt, sl = _case(
        torch,
        3,
        torch.float32,
        num_seqs=len(lens),
        q_heads=4,
        kv_heads=2,
        head_dim=16,
        block_size=block_size,
        share=True,
        lens=lens,
    )
    scale = 0.3
    ref = triton_interp.paged_decode_reference(q, k, v, bt, sl, scale)
    torch.testing.assert_close(ref, _dense(torch, q, k, v, bt, sl, scale))
    out = _run_triton(torch, triton_interp, q, k, v, bt, sl, scale)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    assert bool((out[-1] == 0).all())


def test_triton_rejects_unsupported_inputs(torch, triton_interp) -> None:
    q, k, v, bt, sl = _case(
        torch,
        1,
        torch.float32,
        num_seqs=2,
        q_heads=2,
        kv_heads=1,
        head_dim=16,
        block_size=4,
        share=False,
    )
    with pytest.raises(ValueError, match="int32"):
        triton_interp.paged_decode_triton(q, k, v, bt.long(), sl, 1.0)
    with pytest.raises(ValueError, match="power of two"):
        triton_interp.paged_decode_triton(q[..., :12], k[..., :12], v[..., :12], bt, sl, 1.0)


def test_kernel_facts_from_a_compiled_handle(kernels) -> None:
    meta = SimpleNamespace(shared=39168, num_warps=4, num_stages=3)
    handle = SimpleNamespace(n_regs=104, n_spills=0, metadata=meta)
    props = SimpleNamespace(regs_per_multiprocessor=65536)
    fake_torch = SimpleNamespace(cuda=SimpleNamespace(get_device_properties=lambda i: props))
    facts = device.kernel_facts(handle, fake_torch, False, FULL)
    assert facts["name"] == kernels.TRITON_KERNEL_NAME and facts["tile_tokens"] == 64
    assert facts["resident_programs_per_sm_estimate"] == 4
    assert device.kernel_facts(None, fake_torch, False, FULL)["n_regs"] is None


def test_probe_cpu_smoke_end_to_end(tmp_path: Path, triton_interp) -> None:
    """The whole probe on tiny shapes, with a fake ncu that runs the --ncu-mode child."""
    fake = _fake_ncu(
        tmp_path,
        "import subprocess\n"
        "if sys.argv[1] == '--version': print('fake ncu 0.0'); sys.exit(0)\n"
        "if sys.argv[1] == '--query-metrics': sys.exit(0)\n"
        "args = sys.argv[1:]\n"
        "i = next(j for j, a in enumerate(args) if a.endswith('l2_probe.py')) - 1\n"
        "child = subprocess.run(args[i:], capture_output=True, text=True)\n"
        "sys.stdout.write(child.stdout)\n"
        "if child.returncode or 'done' not in child.stdout:\n"
        "    sys.stderr.write(child.stderr); sys.exit(9)\n"
        f"sys.stdout.write({NCU_CSV!r})\n",
    )
    out_dir = tmp_path / "out"
    run = subprocess.run(
        [
            sys.executable,
            str(PROBE_PATH),
            "--cpu-smoke",
            "--out",
            str(out_dir),
            "--ncu",
            str(fake),
            "--configs",
            "homog_100",
            "mixed_100",
            "homog_100_1div",
            "--ncu-configs",
            "homog_100",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    data = json.loads((out_dir / "l2_probe.json").read_text())
    assert data["mode"] == "cpu-smoke" and not data["errors"]
    assert set(data["configs"]) == {"homog_100", "mixed_100", "homog_100_1div"}
    for name, rec in data["configs"].items():
        assert "error" not in rec, (name, rec.get("traceback_tail"))
        assert rec["correctness"]["ok"] and rec["correctness"]["all_finite"]
        assert rec["timing"]["n"] == 3
    assert data["configs"]["homog_100"]["correctness"]["sequences_checked"] == 8
    ncu = data["ncu"]["runs"]["homog_100"]
    assert ncu["rc"] == 0, ncu
    assert ncu["summary"]["dram_read_bytes"] == 123_456_789
    assert data["ncu"]["metrics"] == list(ncu_plumbing.NCU_METRICS_REQUIRED)
    assert "homog_100" in run.stdout and "results:" in run.stdout
