#!/usr/bin/env bash
# benchmarks/gpu_check.sh OUT [--dry-run] [...]: the GPU check's driver (python -m benchmarks._gpu_check) with the
# repo's interpreter (.venv, else python3) and the source tree on PYTHONPATH. Wheels in .whl/ are installed by the
# driver when packages are missing. OUT/steps.jsonl holds the records of benchmarks/results/gpu_check.jsonl.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-}"
if [ -z "$py" ]; then
  if [ -x "$root/.venv/bin/python" ]; then py="$root/.venv/bin/python"; else py=python3; fi
fi
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
exec "$py" -m benchmarks._gpu_check --command "bash benchmarks/gpu_check.sh$(printf ' %q' "$@")" "$@"
