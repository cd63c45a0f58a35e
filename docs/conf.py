"""Sphinx configuration for the qkern documentation."""

import qkern

try:
    import torch  # noqa: F401
except ImportError:
    # qkern.torch (docs/torch.rst) needs the optional PyTorch; without it,
    # autodoc reads its docstrings against a stand-in module.
    autodoc_mock_imports = ["torch"]

project = "qkern"
author = "qkern developers"
copyright = "qkern developers"
release = qkern.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.doctest",
    "sphinx.ext.mathjax",
    "numpydoc",
]

# numpydoc: parameters/returns from the docstrings; members listed explicitly
# in api.rst, so no autosummary tables (they would warn under -W).
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_validation_checks = set()

autodoc_typehints = "none"
autodoc_member_order = "bysource"

# `sphinx-build -b doctest docs docs/_build/doctest` runs the docstring
# examples pulled in by autodoc.
doctest_global_setup = "import numpy as np\nimport qkern"

default_role = "literal"
primary_domain = "py"
highlight_language = "python3"

exclude_patterns = ["_build"]
templates_path = []

html_theme = "alabaster"
html_title = f"qkern {release}"
html_theme_options = {
    "description": "Quantized CPU kernels for NumPy",
    "fixed_sidebar": True,
}
html_static_path = []
