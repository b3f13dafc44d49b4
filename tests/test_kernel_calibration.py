"""A GPU's kernel calibration file replaces the assumed L2 read rate of its profile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from feather.sim import kernel_calibration as kc
from feather.sim.hardware import get_hardware, hardware_names


def _doc(entries: list[dict], hardware: str = "NVIDIA H100 80GB HBM3", ncu: bool = False) -> dict:
    return {"schema": kc.SCHEMA, "hardware": hardware, "device": "cuda",
            "ncu_available": ncu, "entries": entries, "provenance": {}}


def _entry(config: str, kernel: str, median_s: float, logical: int, hit_pct=None) -> dict:
    return {"config": config, "kernel": kernel, "median_s": median_s,
            "logical_kv_bytes": logical,
            "ncu": None if hit_pct is None else {"l2_hit_rate_pct": hit_pct}}


@pytest.mark.parametrize(
    ("name", "profile"),
    [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100-sxm"),
     ("NVIDIA A100-SXM4-80GB", "a100-80gb"), ("NVIDIA RTX 6000 Ada Generation", "rtx-6000-ada"),
     ("NVIDIA L40S", "l40s"), ("NVIDIA H100 PCIe", None), ("NVIDIA A100-SXM4-40GB", None)],
)
def test_gpu_names_map_to_our_profiles(name: str, profile: str | None) -> None:
    assert kc.profile_for_gpu(name) == profile


def test_the_fastest_homogeneous_paged_read_is_the_l2_rate() -> None:
    doc = _doc([
        _entry("homog_16", "paged", 1e-3, 5_000_000_000),   # 5 TB/s
        _entry("homog_32", "paged", 1e-3, 6_000_000_000),   # 6 TB/s: the fastest
        _entry("mixed_128", "paged", 1e-3, 9_000_000_000),  # mixed: not L2-resident, ignored
        _entry("homog_16", "pat", 1e-3, 9_000_000_000),     # another kernel, ignored
    ])
    assert kc.measured_l2_read_bytes_per_s(doc) == pytest.approx(6e12)


def test_with_ncu_only_batches_that_hit_in_l2_count() -> None:
    doc = _doc([_entry("homog_16", "paged", 1e-3, 5_000_000_000, hit_pct=95.0),
                _entry("homog_32", "paged", 1e-3, 8_000_000_000, hit_pct=40.0)], ncu=True)
    assert kc.measured_l2_read_bytes_per_s(doc) == pytest.approx(5e12)
    with pytest.raises(kc.CalibrationError, match="80% L2 hits"):
        kc.measured_l2_read_bytes_per_s(_doc([doc["entries"][1]], ncu=True))
    with pytest.raises(kc.CalibrationError, match="not a kernel calibration"):
        kc.measured_l2_read_bytes_per_s({"schema": "other"})


def test_a_file_in_the_directory_changes_its_profile_only(tmp_path: Path) -> None:
    doc = _doc([_entry("homog_16", "paged", 1e-3, 4_000_000_000)])
    (tmp_path / "kernel-calibration-nvidia-h100-80gb-hbm3.json").write_text(json.dumps(doc))
    cpu = {**doc, "device": "cpu", "hardware": "cpu"}
    (tmp_path / "kernel-calibration-cpu.json").write_text(json.dumps(cpu))
    found = kc.load_directory(tmp_path)
    assert set(found) == {"h100-sxm"}
    base = get_hardware("h100-sxm")
    calibrated = kc.apply(base, *found["h100-sxm"])
    assert calibrated.l2_bandwidth_bytes_per_s() == pytest.approx(4e12)
    assert base.l2_bandwidth_bytes_per_s() != pytest.approx(4e12)
    assert "measured (kernel-calibration-nvidia-h100-80gb-hbm3.json)" in calibrated.source
    assert calibrated.memory_bandwidth_bytes_per_s == base.memory_bandwidth_bytes_per_s


def test_the_shipped_directory_is_what_every_gpu_profile_runs_with() -> None:
    """A GPU profile's L2 rate is measured exactly where a usable calibration file for it
    ships, and assumed everywhere else (no GPU here has written one yet: then every profile
    must say so, which this checks rather than passing on an empty loop)."""
    shipped = kc.load_directory()
    for profile, (doc, name) in shipped.items():
        assert kc.measured_l2_read_bytes_per_s(doc) > 0, (profile, name)
    gpus = [name for name in hardware_names() if name != "cpu"]
    assert gpus
    for name in gpus:
        measured = "measured (kernel-calibration" in get_hardware(name).source
        assert measured == (name in shipped), name
