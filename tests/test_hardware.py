"""Hardware presets and JSON: round trips, and a field-naming error for every bad value."""

from __future__ import annotations

import copy
import math

import pytest

from slackswap.errors import UnknownNameError, ValidationError
from slackswap.hardware import PRESETS, Hardware, get_hardware


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_round_trip_and_cite_sources(name, tmp_path):
    hardware = PRESETS[name]
    assert Hardware.from_dict(hardware.to_dict()) == hardware
    path = tmp_path / f"{name}.json"
    hardware.save(path)
    assert Hardware.load(path) == hardware == get_hardware(str(path)) == get_hardware(name)
    assert hardware.sources, "every preset cites where its numbers come from"
    assert 0 < hardware.duplex_h2d_factor <= 1 and 0 < hardware.duplex_d2h_factor <= 1


def test_derived_rates_and_duplex_switch():
    h = PRESETS["a100-40gb-pcie4"]
    assert h.achieved_gemm_flops_per_s == h.peak_flops_per_s * h.gemm_efficiency
    assert h.achieved_hbm_bytes_per_s == h.hbm_bytes_per_s * h.hbm_efficiency
    full = h.without_duplex_slowdown()
    assert (full.duplex_h2d_factor, full.duplex_d2h_factor) == (1.0, 1.0) and full.h2d_bytes_per_s == h.h2d_bytes_per_s


BAD = [
    ("h2d_bytes_per_s", -1.0, "hardware.h2d_bytes_per_s must be positive"),
    ("d2h_bytes_per_s", 0, "hardware.d2h_bytes_per_s must be positive"),
    ("peak_flops_per_s", math.nan, "hardware.peak_flops_per_s must be finite"),
    ("hbm_bytes_per_s", math.inf, "hardware.hbm_bytes_per_s must be finite"),
    ("copy_latency_s", -1e-6, "hardware.copy_latency_s must be zero or positive"),
    ("gemm_efficiency", 1.5, "hardware.gemm_efficiency is a fraction and must be at most 1"),
    ("duplex_h2d_factor", 2.0, "hardware.duplex_h2d_factor is a fraction and must be at most 1"),
    ("duplex_d2h_factor", 0.0, "hardware.duplex_d2h_factor must be positive"),
    ("h2d_bytes_per_s", "24GB/s", "hardware.h2d_bytes_per_s must be a number"),
    ("h2d_bytes_per_s", True, "hardware.h2d_bytes_per_s must be a number"),
    ("hbm_capacity_bytes", 4.5e10 + 0.5, "hardware.hbm_capacity_bytes must be an integer"),
    ("name", "", "hardware.name must be a non-empty string"),
    ("description", 3, "hardware.description must be a string"),
    ("sources", "datasheet", "hardware.sources must be a list of non-empty strings"),
    ("pcie_lanes", 16, "hardware has unknown field 'pcie_lanes'"),
    ("format", "slackswap.hardware/7", "hardware.format is 'slackswap.hardware/7'"),
    ("h2d_bytes_per_s", ..., "hardware.h2d_bytes_per_s is missing"),
]


@pytest.mark.parametrize("key, value, message", BAD, ids=[f"{k}={v!r}" for k, v, _ in BAD])
def test_bad_hardware_names_the_field(key, value, message):
    data = copy.deepcopy(PRESETS["a100-40gb-pcie4"].to_dict())
    if value is ...:
        del data[key]
    else:
        data[key] = value
    with pytest.raises(ValidationError) as info:
        Hardware.from_dict(data)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_constructor_checks_numbers_too():
    with pytest.raises(ValidationError, match="hardware.d2h_bytes_per_s must be a finite number"):
        PRESETS["h100-pcie5"].replace(d2h_bytes_per_s=math.nan)
    with pytest.raises(ValidationError, match="hardware.duplex_h2d_factor must be positive"):
        PRESETS["h100-pcie5"].replace(duplex_h2d_factor=0.0)


def test_unknown_names_and_bad_files(tmp_path):
    with pytest.raises(UnknownNameError, match="unknown hardware 'a100': choose one of a100-40gb-pcie4"):
        get_hardware("a100")
    path = tmp_path / "hw.json"
    path.write_text('{"name": "x",')
    with pytest.raises(ValidationError, match=r"hardware file .* is not valid JSON"):
        get_hardware(str(path))
    with pytest.raises(ValidationError, match="does not exist"):
        get_hardware(str(tmp_path / "none.json"))
