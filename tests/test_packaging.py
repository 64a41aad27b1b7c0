"""The layout is the architecture: the library imports no application, nothing imports in a
circle, and an installed dqcep adds nothing but the ``dqcep`` package to site-packages."""
import ast
import os
import re
import subprocess
import venv
import zipfile
from pathlib import Path

import pytest

# Each test here starts processes or a broker: the quick run leaves them out.
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent

# Where each installed package lives in the repository (pyproject.toml's package-dir).
SOURCES = {"dqcep": ROOT / "dqcep", "dqcep.generator": ROOT / "generator",
           "dqcep.spark": ROOT / "spark"}

# The library, bottom to top, and what each part may import (besides itself).
LIBRARY = {
    "dqcep.core.errors": set(),
    "dqcep.core.events": set(),
    "dqcep.core.batch": {"dqcep.core.events"},
    "dqcep.core.tables": {"dqcep.core.events"},  # lookup tables' snapshots: data, like events
    "dqcep.core.admission": {"dqcep.core.errors"},  # spec section 7's parameters and ticks
    "dqcep._kernels": set(),
    "dqcep.lang": {"dqcep.core.errors"},
    "dqcep.plan": {"dqcep.lang", "dqcep.core.errors", "dqcep._kernels"},  # the bytecode's opcodes
    "dqcep.runtime": {"dqcep.plan", "dqcep.lang", "dqcep._kernels", "dqcep.core.batch",
                      "dqcep.core.errors", "dqcep.core.events", "dqcep.core.tables",
                      "dqcep.core.admission"},
    "dqcep.io": {"dqcep._kernels", "dqcep.core.batch", "dqcep.core.errors", "dqcep.core.events",
                 "dqcep.core.tables"},
}


def _modules():
    """Every Python and Cython module of the installed packages, as (dotted name, path)."""
    for package, folder in SOURCES.items():
        for path in sorted(folder.rglob("*")):
            if path.suffix not in (".py", ".pyx", ".pxd"):
                continue
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            if package == "dqcep" and parts and parts[0] in ("generator", "spark"):
                continue
            yield ".".join([package, *parts]), path


def _unit(module: str) -> str:
    """The part of the layout a module belongs to: a subpackage, or a module of
    ``dqcep.core`` (its modules are layered among themselves: errors and events below
    the batch and the tables).

    A ``__main__`` is an entry point of its own (nothing imports it)."""
    if module.endswith(".__main__"):
        return module
    if module.startswith("dqcep.core."):
        return ".".join(module.split(".")[:3])
    for package in ("dqcep.generator", "dqcep.spark"):
        if module == package or module.startswith(package + "."):
            return package
    return ".".join(module.split(".")[:2])


def _imports(name: str, path: Path):
    """Every dqcep module a file imports, at module level or inside a function."""
    text = path.read_text()
    if path.suffix == ".py":
        found = []
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                found += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{path}:{node.lineno}: the project imports absolutely"
                found.append(node.module)
        return [m for m in found if m == "dqcep" or m.startswith("dqcep.")]
    # Cython: cimport / import lines
    return re.findall(r"^\s*(?:from|c?import)\s+(dqcep(?:\.\w+)*)", text, re.M)


def _graph():
    edges = {}
    for name, path in _modules():
        unit = _unit(name)
        for target in _imports(name, path):
            if target == "dqcep":
                continue
            edges.setdefault(unit, set()).add(_unit(target))
    for unit in edges:
        edges[unit].discard(unit)
    return edges


def test_the_library_imports_no_application():
    edges = _graph()
    assert set(LIBRARY) <= {_unit(n) for n, _ in _modules()}
    wrong = {unit: sorted(edges.get(unit, set()) - allowed)
             for unit, allowed in LIBRARY.items() if edges.get(unit, set()) - allowed}
    assert wrong == {}, f"library parts importing above their layer: {wrong}"


def test_no_import_circle_between_parts():
    edges = _graph()
    # Tarjan's strongly connected components over the parts of the layout.
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in list(edges):
        if v not in index:
            visit(v)
    assert circles == []


def test_the_scan_sees_the_applications_edges():
    """The check above can fail: the old generator CLI imported dqcep.cli back."""
    edges = _graph()
    assert edges["dqcep.generator.__main__"] == {"dqcep.cli"}
    assert "dqcep.generator" in edges["dqcep.cli"]
    assert "dqcep.cli" not in edges.get("dqcep.generator", set())
    assert "dqcep.spark" in edges["dqcep.cli"] and "dqcep.cli" not in edges["dqcep.spark"]


def test_the_wheel_holds_only_the_dqcep_package_and_no_generated_c(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"dqcep", f"{wheel.name.split('-')[0]}-"
                                                f"{wheel.name.split('-')[1]}.dist-info"}
    # generated C and cython -a's annotations never; the service's page is a source
    assert not [n for n in names if n.endswith((".c", ".cpp", ".html"))
                and n != "dqcep/service/page.html"]
    for needed in ("dqcep/service/page.html", "dqcep/generator/core.py", "dqcep/spark/batch.py",
                   "dqcep/lang/grammar.lark",
                   "dqcep/data/iot.cep", "dqcep/_kernels/ring.pxd", "dqcep/_kernels/ring.pyi"):
        assert needed in names
    assert len([n for n in names if n.startswith("dqcep/_kernels/") and n.endswith(".so")]) \
        == len(list((ROOT / "dqcep/_kernels").glob("*.pyx")))
    # the generator's walk kernel, beside the generator
    assert [n for n in names if n.startswith("dqcep/generator/_walk.") and n.endswith(".so")]
    assert "dqcep/generator/_walk.pyi" in names


def test_a_fresh_venv_install_runs_the_commands_and_has_no_top_level_generator(wheel, tmp_path):
    # The venv sees the packages of the interpreter running the tests (numpy, lark,
    # pyarrow, pyspark), but its own dqcep first. Those are the base interpreter's
    # site-packages when the tests run with the system's Python (CI), and the venv's
    # when the README's command runs inside a venv: its site-packages are added after
    # the new venv's own by a .pth file (a plain path: the editable dqcep installed
    # there is a .pth finder, which a path entry does not load).
    import sysconfig
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=True, with_pip=True)
    py, dqcep = env_dir / "bin/python", env_dir / "bin/dqcep"
    own = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    outer = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    Path(own, "tests-outer-site.pth").write_text("".join(f"{p}\n" for p in outer))
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def run(*args):
        return subprocess.run([*map(str, args)], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300)

    where = run(py, "-c", "import dqcep, dqcep.generator, dqcep.spark; print(dqcep.__file__)")
    assert where.returncode == 0, where.stderr
    assert where.stdout.startswith(str(env_dir)), where.stdout
    for top in ("generator", "spark"):
        r = run(py, "-c", f"import {top}")
        assert r.returncode != 0 and f"No module named '{top}'" in r.stderr
    demo = run(dqcep, "demo", "--events", "20000")
    assert demo.returncode == 0 and "matches" in demo.stdout, demo.stdout + demo.stderr
    gen = run(dqcep, "generate", "--profile", "iot", "--events", "100", "--output", "e.jsonl")
    assert gen.returncode == 0 and (tmp_path / "e.jsonl").stat().st_size > 0, gen.stderr
    same = run(py, "-m", "dqcep.generator", "--profile", "iot", "--events", "100", "--output",
               "f.jsonl")
    assert same.returncode == 0, same.stderr
    assert (tmp_path / "f.jsonl").read_bytes() == (tmp_path / "e.jsonl").read_bytes()
    spark = run(dqcep, "spark", "run", "--help")
    assert spark.returncode == 0 and "usage: dqcep spark run" in spark.stdout, spark.stderr


KERNEL_FOLDERS = {"dqcep/_kernels": "dqcep._kernels", "generator": "dqcep.generator"}


@pytest.mark.parametrize("folder,module", sorted(
    (folder, p.stem) for folder in KERNEL_FOLDERS for p in (ROOT / folder).glob("*.pyx")))
def test_every_compiled_module_has_a_stub_that_matches_it(folder, module):
    """A .pyi per kernel, naming only what the compiled module has, and every public
    class and function of the module (the stub is how a reader and a type checker see it)."""
    import importlib
    import inspect

    stub = ROOT / folder / f"{module}.pyi"
    assert stub.exists(), f"{folder}/{module}.pyi is missing"
    compiled = importlib.import_module(f"{KERNEL_FOLDERS[folder]}.{module}")
    assert compiled.__file__.endswith(".so")
    tree = ast.parse(stub.read_text())
    declared = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            declared.add(node.name)
            assert hasattr(compiled, node.name), f"{module}.pyi: {node.name} is not in the module"
            if isinstance(node, ast.ClassDef):
                cls = getattr(compiled, node.name)
                for item in node.body:
                    name = item.name if isinstance(item, ast.FunctionDef) else \
                        item.target.id if isinstance(item, ast.AnnAssign) else None
                    if name and name != "__init__":
                        assert hasattr(cls, name), f"{module}.pyi: {node.name}.{name} is not there"
        elif isinstance(node, ast.AnnAssign):
            declared.add(node.target.id)
            assert hasattr(compiled, node.target.id), f"{module}.pyi: {node.target.id}"
    public = {n for n, v in vars(compiled).items() if not n.startswith("_")
              and (inspect.isclass(v) or callable(v)) and getattr(v, "__module__", "")
              == compiled.__name__}
    assert public <= declared, f"{module}.pyi lacks {sorted(public - declared)}"
