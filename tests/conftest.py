import gnnscale._compat  # noqa: F401  (warning filters)
