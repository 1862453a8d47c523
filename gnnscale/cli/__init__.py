"""``gnnscale`` command line: thin -- parse flags, build a config, pick an engine, train. One module per
command (``train_cmd``, ``partition_cmd``, ``data_cmd``), the flags in :mod:`.parser`, the entry point in
:mod:`.main`.

Bad input of any kind exits with status 2 and one ``error: ...`` line on stderr, leaving no partial files.
"""

from gnnscale.cli.main import main
from gnnscale.cli.parser import build_parser

__all__ = ["build_parser", "main"]
