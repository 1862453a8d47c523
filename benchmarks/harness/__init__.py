"""The one benchmark harness: cases in their own processes, interleaved rounds, records, rendering.

A benchmark is a module ``benchmarks/NAME.py`` with:

* ``TITLE``: its RESULTS.md heading;
* ``cases(args) -> list[Case]``: what to run (``args``: the parsed command line, with ``args.quick``);
* ``run(params) -> dict | list[dict]``: one case, called in a child process that has one thread (``--threads``);
  the records it returns are appended to ``benchmarks/results/NAME.jsonl`` with the harness's fields
  (:data:`benchmarks.harness.runner.HARNESS_FIELDS`);
* ``render(records) -> str``: its RESULTS.md section body, from the records of its file (a pure function: the same
  records give the same text);
* optionally ``add_arguments(ap)`` (its own flags), ``ROUNDS`` (default rounds, 3 when absent; ``--quick``: 1),
  ``headline(records) -> list[Row]`` (rows of the at-a-glance table) and ``RESULTS`` (the records' file stem when
  it is not the module's name).

Only the standard library is imported here and in :mod:`benchmarks.harness.child` (a peer's own venv runs cases).
"""

from benchmarks.harness.cases import Case, schedule
from benchmarks.harness.records import Row, append_records, fmt, latest_session, read_records, split_list

__all__ = ["Case", "Row", "append_records", "fmt", "latest_session", "read_records", "schedule", "split_list"]
