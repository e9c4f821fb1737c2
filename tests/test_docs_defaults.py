"""The defaults docs/security.md states equal the config's (issue 18: the doc said 1 MiB)."""

from __future__ import annotations

import re
from pathlib import Path

from omni_ray.config.serving import LimitsConfig, SecurityConfig

DOC = Path(__file__).resolve().parents[1] / "docs" / "security.md"
UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def doc_rows() -> dict[str, str]:
    """``{"limits.max_body_bytes": "32 MiB", ...}`` from the doc's settings table."""
    rows = re.findall(r"^\| `(limits\.\w+)` \| ([^|]+) \|", DOC.read_text(), re.M)
    return {name: value.strip() for name, value in rows}


def parse(value: str) -> float:
    m = re.match(r"([\d.]+)(?: (KiB|MiB|GiB))?", value)
    assert m, f"no number in {value!r}"
    return float(m.group(1)) * UNITS.get(m.group(2), 1)


def test_every_limit_is_documented_with_its_default():
    rows = doc_rows()
    fields = {f"limits.{k}": v.default for k, v in LimitsConfig.model_fields.items()}
    assert set(rows) == set(fields), {"undocumented": sorted(set(fields) - set(rows)),
                                      "not a field": sorted(set(rows) - set(fields))}
    wrong = {k: (rows[k], fields[k]) for k in rows if parse(rows[k]) != fields[k]}
    assert wrong == {}, wrong


def test_documented_prompt_char_bound_matches():
    lim = LimitsConfig()
    assert f"{lim.max_prompt_chars} characters by default" in DOC.read_text()


def test_documented_security_defaults():
    text = DOC.read_text()
    sec = SecurityConfig()
    assert f"(default `{sec.api_keys_env}`)" in text
    for flag in ("enable_debug_endpoints", "allow_fault_injection", "enable_metrics_endpoint"):
        assert getattr(sec, flag) is False
        assert re.search(rf"`security\.{flag}` \(default false\)", text), flag
