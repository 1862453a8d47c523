"""Sphinx configuration of gnnscale's documentation: the guides in this folder (Markdown, through myst-parser) and
the API reference in api/ (autodoc over the docstrings, Google style through napoleon).

Build it with ``make docs`` (``sphinx-build -W``: a warning fails the build); the pages land in build/docs/.
Nothing here reaches the network: no intersphinx, the built-in alabaster theme.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's gnnscale, also when it is not installed

from gnnscale.version import __version__  # noqa: E402

project = "gnnscale"
author = "gnnscale developers"
copyright = "gnnscale developers"
version = release = __version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "myst_parser",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# Google-style docstrings (Args: / Returns: / Raises:), as gnnscale writes them.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_class_signature = "separated"
# gnnscale's docstrings name types in prose and in ``literals``; a name autodoc cannot resolve is not a fault.
nitpicky = False

# Fenced blocks without a language (the guides' command lines, formats) are shown as plain text.
highlight_language = "none"
myst_heading_anchors = 3

html_theme = "alabaster"
html_title = f"gnnscale {release}"
html_theme_options = {"description": "GNN training beyond one GPU's memory", "page_width": "1100px"}


def setup(app):
    """docs/architecture.md's ```layers block (read by tests/test_architecture.py) is shown as plain text."""
    from pygments.lexers.special import TextLexer

    app.add_lexer("layers", TextLexer)
