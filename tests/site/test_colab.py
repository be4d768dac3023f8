"""The chapter notebooks run in a fresh environment the way Colab runs them.

attnlib's wheel is built from this checkout and a new virtual environment gets only what Colab
has before the first cell (PyTorch 2.13.0, a Jupyter kernel). Each outputless notebook
``chapters/<id>.ipynb`` is then executed top to bottom with nbclient in that environment; its
install cell, with the repository URL replaced by the local wheel, installs attnlib (and what the
chapter needs besides, the ``notebook`` extra) because attnlib is not importable there.

Cost: the environment takes about a minute or two to create; chapter 0 executes in under a
minute and runs in every test run. The other chapters take the length of their quick profile
each (several minutes), so they run only with ``make test-colab`` (ATTNBOOK_TEST_COLAB=all).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from attnbook import colab as _colab
from attnbook.params import toc_chapters

from ..conftest import ROOT

#: Chapters executed in every test run (cheap); the others need ATTNBOOK_TEST_COLAB=all.
DEFAULT = ("00-attention",)
#: Seconds one cell may take in the fresh environment.
CELL_TIMEOUT = 1800


def _run(cmd, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        command = " ".join(map(str, cmd))
        raise AssertionError(f"{command} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


@pytest.fixture(scope="module")
def fresh_env(tmp_path_factory):
    """``(python of a new venv with torch and a kernel but no attnlib, the attnlib wheel)``."""
    base = tmp_path_factory.mktemp("colab")
    t0 = time.perf_counter()
    # the wheel is built from a copy, so that setuptools' build/ folder never lands in the checkout
    source = base / "source"
    for package in ("attnlib", "attnbook"):  # one distribution, two packages
        shutil.copytree(ROOT / package, source / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, source / name)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
          "-w", str(base / "dist"), str(source)])
    wheel = next((base / "dist").glob("attnlib-*.whl"))
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    # what Colab has before the first cell: torch and a Jupyter kernel (nbclient drives it);
    # installed without byte-compiling every module (half of pip's time; the two or three
    # processes started in this environment compile only what they import: 155 s -> 113 s for
    # this test on a 2-core CI machine)
    _run([str(python), "-m", "pip", "install", "--quiet", "--no-compile", "torch==2.13.0",
          "ipykernel", "nbclient"])
    probe = _run([str(python), "-c", "import importlib.util as u; print(u.find_spec('attnlib'))"],
                 cwd=base)
    assert probe.stdout.strip() == "None", "attnlib must not be importable before the install cell"
    print(f"fresh environment ready in {time.perf_counter() - t0:.0f} s")
    return python, wheel


_EXECUTE = """
import sys, nbformat
from nbclient import NotebookClient
nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(nb, timeout=int(sys.argv[3]), kernel_name="python3",
               resources={"metadata": {"path": sys.argv[2]}}).execute()
nbformat.write(nb, sys.argv[1])
"""


def _chapters():
    every = os.environ.get("ATTNBOOK_TEST_COLAB") == "all"
    params = []
    for chapter in toc_chapters():
        marks = [] if (every or chapter in DEFAULT) else [pytest.mark.skip(
            reason="runs the whole quick profile in a fresh venv: `make test-colab`")]
        params.append(pytest.param(chapter, marks=marks))
    return params


@pytest.mark.parametrize("chapter", _chapters())
def test_outputless_notebook_runs_in_a_fresh_environment(fresh_env, tmp_path, chapter):
    python, wheel = fresh_env
    nb = json.loads((ROOT / "chapters" / f"{chapter}.ipynb").read_text())
    install = nb["cells"][0]
    spec = _colab.install_spec(ROOT)
    source = "".join(install["source"])
    assert spec in source, "the first cell must install attnlib from the repository setting"
    local = f"attnlib[notebook] @ {wheel.as_uri()}"
    install["source"] = source.replace(spec, local)
    work = tmp_path / "run"
    work.mkdir()
    path = work / f"{chapter}.ipynb"
    path.write_text(json.dumps(nb))
    t0 = time.perf_counter()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["MPLBACKEND"] = "Agg"
    # the install cell's pip without byte-compiling, as above (pip reads a --no-* option's
    # environment variable as the value of its positive form: "0" is --no-compile)
    env["PIP_NO_COMPILE"] = "0"
    # the checkout stands in for the repository's raw files (benchmark records), as the wheel
    # stands in for the repository URL
    env["ATTNLIB_REPO_DIR"] = str(ROOT)
    _run([str(python), "-c", _EXECUTE, str(path), str(work), str(CELL_TIMEOUT)], cwd=work, env=env)
    print(f"{chapter}: executed in the fresh environment in {time.perf_counter() - t0:.0f} s")
    ran = json.loads(path.read_text())
    errors = [o for c in ran["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    where = _run([str(python), "-c", "import attnlib; print(attnlib.__file__)"], cwd=work).stdout
    assert str(python.parent.parent) in where, f"attnlib came from {where}, not the installed wheel"
    assert (work / f"{chapter}.summary.json").exists()


@pytest.mark.parametrize("chapter", toc_chapters())
def test_notebook_markdown_is_plain_jupyter(chapter):
    """No MyST role, directive, label target or book macro is left in the notebook's Markdown."""
    import re

    nb = json.loads((ROOT / "chapters" / f"{chapter}.ipynb").read_text())
    text = "\n".join("".join(c["source"]) for c in nb["cells"][3:] if c["cell_type"] == "markdown")
    assert not re.findall(r"\{[a-z]+(?::[a-z]+)?\}`[^`]*`", text)
    assert not re.findall(r"^`{3,}\{", text, re.M)
    assert not re.findall(r"^\([\w-]+\)=\s*$", text, re.M)
    for macro in _colab.macros(ROOT):
        assert not re.search(rf"\\{macro}(?![A-Za-z])", text), f"\\{macro} left in the text"


@pytest.mark.book
@pytest.mark.parametrize("chapter", toc_chapters())
def test_notebook_numbers_are_the_pages_numbers(html_dir, chapter):
    """Equation and figure numbers written into the notebook are those of the chapter's page."""
    import re

    html = (html_dir / "chapters" / f"{chapter}.html").read_text()
    labels = _colab._labels(ROOT)
    equations = re.findall(r'id="equation-([\w-]+)">\s*<span class="eqno">\(([\d.]+)\)', html)
    figures = re.findall(r'<figure[^>]*id="([\w-]+)"[^>]*>.*?<span class="caption-number">Fig\. ([\d.]+) ',
                         html, re.S)
    assert equations or figures
    # HTML ids are the labels lower-cased (docutils), e.g. fig-ch4-U -> fig-ch4-u
    eq_labels = {k.lower(): v for k, v in labels["eq"].items()}
    fig_labels = {k.lower(): v for k, v in labels["fig"].items()}
    assert {k: eq_labels.get(k) for k, _ in equations} == dict(equations)
    assert {k: fig_labels.get(k) for k, _ in figures} == dict(figures)
