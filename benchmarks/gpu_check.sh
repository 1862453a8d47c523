#!/usr/bin/env bash
# benchmarks/gpu_check.sh OUT [--dry-run] [...]: benchmarks/gpu_check.py with the repo's interpreter (.venv, else
# python3) and the source tree on PYTHONPATH. Wheels in .whl/ are installed by the driver when packages are missing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-}"
if [ -z "$py" ]; then
  if [ -x "$root/.venv/bin/python" ]; then py="$root/.venv/bin/python"; else py=python3; fi
fi
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
exec "$py" "$root/benchmarks/gpu_check.py" "$@"
