"""Rules of the test suite itself: with CI=true a skipped test fails the run unless it is marked
gpu (tests/conftest.py); markers are registered (--strict-markers); test module basenames are
unique (pytest imports them by basename) and no test module imports another (shared helpers live
in conftest.py or *_helpers.py modules)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

TESTS = Path(__file__).parent
CONFTEST = (TESTS / "conftest.py").read_text()
SUITE = '''
import pytest

def test_ok():
    pass

@pytest.mark.gpu
@pytest.mark.skipif(True, reason="needs a CUDA device")
def test_gpu_only():
    pass

@pytest.mark.skipif(True, reason="faad is not installed")
def test_needs_a_tool():
    pass

def test_skips_itself():
    pytest.skip("not there yet")

@pytest.mark.xfail(reason="known")
def test_known_failure():
    assert False
'''


@pytest.fixture
def suite(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_suite=SUITE)
    pytester.makefile(".ini", pytest="[pytest]\nmarkers =\n    gpu: needs a CUDA device\n")
    return pytester


@pytest.mark.parametrize("ci", ["true", ""])
def test_only_gpu_skips_pass_on_ci(suite, monkeypatch, ci):
    monkeypatch.setenv("CI", ci)
    result = suite.runpytest_subprocess("-p", "no:cacheprovider")
    if ci:
        result.assert_outcomes(passed=1, skipped=1, errors=1, failed=1, xfailed=1)
        result.stdout.fnmatch_lines(["*skipped on CI*faad is not installed*"])
    else:
        result.assert_outcomes(passed=1, skipped=3, xfailed=1)


def test_markers_are_strict():
    import tomllib

    cfg = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    pytest_cfg = cfg["tool"]["pytest"]["ini_options"]
    assert "--strict-markers" in pytest_cfg["addopts"].split()
    assert {m.split(":")[0] for m in pytest_cfg["markers"]} >= {"slow", "vllm", "gpu"}


def test_module_basenames_are_unique():
    names = {}
    for p in sorted(TESTS.rglob("*.py")):
        if p.name not in ("conftest.py", "__init__.py") and "artifacts" not in p.parts:
            names.setdefault(p.name, []).append(str(p.relative_to(TESTS)))
    assert {n: ps for n, ps in names.items() if len(ps) > 1} == {}


def test_no_test_module_imports_another():
    test_modules = {p.stem for p in TESTS.rglob("test_*.py")}
    bad = []
    for p in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad += [f"{p.relative_to(TESTS)}: {n}" for n in names
                    if n.split(".")[-1] in test_modules or n.startswith("tests.")]
    assert bad == []
