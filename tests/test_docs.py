"""The documentation a user reads runs: every public name of the public modules has a
numpydoc docstring with an Example, and the Examples and the README's code blocks run and
print what they say."""
import doctest
import importlib
import inspect
import os
import re

import numpy as np
import pytest

import flexformer as ff

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
#: the public modules: their ``__all__`` is the public surface the API reference shows
MODULES = ["flexformer", "flexformer.init", "flexformer.testing", "flexformer.reference", "flexformer.recurrent",
           "flexformer.diagnostics", "flexformer.nn", "flexformer.training", "flexformer.data", "flexformer.distill"]
TORCH_MODULES = ["flexformer.torch", "flexformer.torch.nn"]


def _public(modules):
    names = []
    for module_name in modules:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isfunction(obj) or inspect.isclass(obj):
                names.append(f"{module_name}.{name}")
    return names


def _resolve(dotted):
    module_name, name = dotted.rsplit(".", 1)
    return getattr(importlib.import_module(module_name), name)


PUBLIC = _public(MODULES)
try:
    import torch  # noqa: F401
    PUBLIC += _public(TORCH_MODULES)
except ImportError:  # the bridge's names are checked where torch is installed
    pass


def _takes_arguments(obj) -> bool:
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        names = [p for p in inspect.signature(target).parameters if p not in ("self", "cls")]
    except (TypeError, ValueError):
        return False
    return bool(names)


@pytest.mark.parametrize("name", PUBLIC)
def test_public_name_has_a_numpydoc_docstring_with_an_example(name):
    obj = _resolve(name)
    doc = inspect.getdoc(obj) or ""
    assert "Examples\n--------\n" in doc and ">>> " in doc.split("Examples\n--------\n", 1)[1], \
        f"{name}: no Examples section"
    if _takes_arguments(obj) and not (inspect.isclass(obj) and "Attributes\n" in doc):
        assert "Parameters\n----------\n" in doc, f"{name}: no Parameters section"


@pytest.mark.parametrize("name", PUBLIC)
def test_examples_run(name):
    obj = _resolve(name)
    finder = doctest.DocTestFinder(recurse=inspect.isclass(obj))
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    tests = [t for t in finder.find(obj, name, globs={}) if t.examples]
    assert tests
    try:
        for t in tests:
            runner.run(t)
    finally:
        ff.set_num_threads(0)
    assert runner.failures == 0, f"{runner.failures} example(s) of {name} failed (see the output above)"


def test_readme_python_blocks_run():
    text = open(os.path.join(ROOT, "README.md")).read()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 2
    scope = {}
    exec(compile(blocks[0], "README NumPy block", "exec"), scope)
    assert scope["out"].shape == (2, 4, 1024, 64) and scope["dtau"].shape == (4,)
    pytest.importorskip("torch")
    scope = {}  # each block is whole on its own: a reader may copy just that one
    exec(compile(blocks[1], "README PyTorch block", "exec"), scope)
    assert scope["q"].grad is not None and scope["params"]["tau"].grad is not None


def _markdown_files():
    files = [os.path.join(ROOT, "README.md")]
    for folder, _, names in os.walk(os.path.join(ROOT, "docs")):
        if "_build" not in folder:
            files += [os.path.join(folder, n) for n in sorted(names) if n.endswith(".md")]
    return files


@pytest.mark.parametrize("path", _markdown_files(), ids=lambda p: os.path.relpath(p, ROOT))
def test_markdown_tables_render_as_tables(path):
    """Each pipe table's delimiter row (|---|---:|) must have as many cells as its header,
    or the GitHub / MyST parser shows the whole table as a paragraph of pipes."""
    markdown_it = pytest.importorskip("markdown_it")
    text = open(path, encoding="utf-8").read()
    # tables inside code blocks are not tables: blank them, keeping the line numbers
    body = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    delimiters = [i for i, line in enumerate(body.split("\n"))
                  if re.fullmatch(r"\|?(\s*:?-{3,}:?\s*\|)+\s*(:?-{3,}:?\s*)?", line.strip())]
    tokens = markdown_it.MarkdownIt("commonmark").enable("table").parse(body)
    tables = [t.map[0] for t in tokens if t.type == "table_open"]
    assert len(tables) == len(delimiters), (
        f"{os.path.relpath(path, ROOT)}: {len(delimiters)} delimiter rows but {len(tables)} tables parsed; "
        f"the delimiter rows of lines {[i + 1 for i in delimiters if i - 1 not in tables]} do not match "
        "their header's number of cells")


def test_ctags_indexes_the_kernels_under_their_compiled_names(tmp_path):
    """The repository's .ctags.d makes Universal Ctags read csrc/*.inc as C and expand FF():
    the kernels appear under the names profilers show (flex_s_attention_f32)."""
    import shutil
    import subprocess

    ctags = shutil.which("ctags")
    if ctags is None or "Universal Ctags" not in subprocess.run([ctags, "--version"], capture_output=True,
                                                                  text=True).stdout:
        pytest.skip("Universal Ctags is not installed")
    tags = tmp_path / "tags"
    subprocess.run([ctags, "-f", str(tags), "-R", "csrc"], cwd=ROOT, check=True)
    names = {line.split("\t", 1)[0] for line in tags.read_text().splitlines() if not line.startswith("!")}
    assert {"flex_s_attention_f32", "linattn_run_f32", "flex_n_attention_f32", "softmax_attention_f32"} <= names
