"""Sphinx configuration: the user guide (Markdown, through MyST) and the API reference,
generated from the package's numpydoc docstrings (napoleon). Build:
``sphinx-build -W docs docs/_build/html``; the package must be importable (installed)."""
import flexformer

project = "flexformer"
author = "The flexformer developers"
copyright = "2026, The flexformer developers"
release = version = flexformer.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autosummary_generate = False
# the PyTorch bridge is documented when torch is installed (the docs extra does not need it)
try:
    import torch  # noqa: F401
    autodoc_mock_imports = []
except ImportError:
    autodoc_mock_imports = ["torch"]

myst_heading_anchors = 3
# links from the guide to files of the repository outside docs/ (README, benchmarks/, ...)
suppress_warnings = ["myst.xref_missing"]

html_theme = "alabaster"
html_title = f"flexformer {release}"


def _plain_bars(app, what, name, obj, options, lines):
    """The docstrings write absolute values and norms as |x|, which reStructuredText would
    read as substitutions: escape every bar outside literals."""
    import re

    for i, line in enumerate(lines):
        parts = re.split(r"(``.*?``)", line)
        lines[i] = "".join(p if p.startswith("``") else p.replace("|", r"\|") for p in parts)


#: the line of api.md that stands for the named functions, which the registry generates
NAMED_FUNCTIONS_MARK = ".. the named functions of every linear kind: conf.py lists flexformer.named.__all__ here"


def list_named_functions(app, docname, source):
    """api.md lists ``<kind>_attention`` and its backward for every kind the registry
    generates them for (flexformer.named), so no list of kinds is kept by hand here."""
    if docname == "api":
        from flexformer import named
        lines = "\n".join(f".. autofunction:: {name}" for name in named.__all__)
        source[0] = source[0].replace(NAMED_FUNCTIONS_MARK, lines)


def setup(app):
    app.connect("autodoc-process-docstring", _plain_bars)
    app.connect("source-read", list_named_functions)
