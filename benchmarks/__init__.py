"""gnnscale's benchmarks: ``python -m benchmarks --list``, ``python -m benchmarks NAME [--quick]``.

Each benchmark is a module of this folder that declares its cases and how to render their records; the harness
(:mod:`benchmarks.harness`) runs every case in its own process with one thread, in interleaved rounds, and appends
one record per run to ``benchmarks/results/NAME.jsonl``. ``python -m benchmarks results`` writes RESULTS.md from
those records. Importing this package imports nothing else (a peer's own venv imports it too).
"""
