"""The documentation site: Sphinx, pages in Markdown (MyST), the PyData theme, autodoc for the API.

Build: ``pip install -e ".[docs]"`` then ``sphinx-build -W --keep-going docs OUT`` (CI does, in
``.ci/run``: every warning fails). The site needs no network, to build or to view: no intersphinx,
no web fonts, no scripts or styles from elsewhere.
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import version as _version
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))
# The API pages document the Python decoder: the compiled one (segmenter/_fastwire.c, built where a
# compiler is) has the same signature and results, and the pages must not depend on the machine.
os.environ["SEGMENTER_PURE_PYTHON"] = "1"

project = "segment-reassembly"
author = "the segment-reassembly authors"
copyright = "the segment-reassembly authors"
release = _version("segment-reassembly")
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinxarg.ext",
    "reference",  # docs/_ext/reference.py: the API pages and the reason-code table, from the code
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
templates_path: list[str] = []

smartquotes_action = "qe"  # quotes and ellipses only: "--raw-column" stays two hyphens, not a dash

# --- MyST ---
myst_enable_extensions = ["colon_fence", "deflist"]
myst_ref_domains = ["std", "py"]  # a Markdown link is a page, an anchor or a Python object, never a CLI "command"
myst_heading_anchors = 3  # GitHub-style slugs for h1-h3: [exit codes](../reference/command-line.md#exit-codes)

# --- autodoc ---
autodoc_typehints = "description"  # the signature stays short; the types go with each parameter
autodoc_typehints_format = "short"
autodoc_member_order = "bysource"
autodoc_class_signature = "mixed"
autodoc_default_options = {"exclude-members": "__init__, __new__, __weakref__, __dict__, __module__"}
autodoc_preserve_defaults = True  # a default shows as written (DEFAULT_SEGMENT_SIZE), not its value
add_module_names = False
python_display_short_literal_types = True

# --- warnings ---
# Every warning fails the build (-W), and none is silenced: docstrings are fixed at the source, and
# docs/_ext/reference.py resolves what autodoc alone would warn about (re-exported names, builtins
# in type hints that match a field's name).
suppress_warnings: list[str] = []

# --- HTML: the PyData theme, offline ---
html_theme = "pydata_sphinx_theme"
html_title = "segment-reassembly"
html_static_path = ["_static"]
html_css_files = ["custom.css"]
html_show_sourcelink = False
html_copy_source = False
html_last_updated_fmt = None
html_theme_options = {
    "navbar_align": "left",
    "show_toc_level": 2,
    "navigation_with_keys": False,
    "show_prev_next": True,
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
    "secondary_sidebar_items": ["page-toc"],
    "article_header_start": ["breadcrumbs"],
}
html_context = {"default_mode": "light"}
