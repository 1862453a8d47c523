"""The machine and the source a run measures: CPU model, git state, clean worktrees of a revision."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


class RevisionError(RuntimeError):
    """A revision that cannot be measured as asked."""


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "cpu"


def host_cpu() -> str:
    return f"{cpu_model()} ({os.cpu_count()} cores)"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def resolve(repo: Path, rev: str) -> str:
    """``rev``'s full commit hash; RevisionError when it is not a commit of ``repo``."""
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except (subprocess.CalledProcessError, OSError):
        raise RevisionError(f"{rev!r} is not a commit of {repo}") from None


def changed_paths(repo: Path) -> list[str]:
    """Uncommitted changes under gnnscale/ or benchmarks/ (records under benchmarks/results/ and caches aside)."""
    out = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--", "gnnscale", "benchmarks"],
                         capture_output=True, text=True, check=True).stdout  # not stripped: " M path"
    paths = [ln[3:] for ln in out.splitlines() if ln.strip()]
    return [p for p in paths if not p.startswith("benchmarks/results/") and "cache" not in p]


class _Terminated(Exception):
    pass


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated(f"signal {signum}")


@contextlib.contextmanager
def worktrees(repo: Path, hashes: dict[str, str]) -> Iterator[dict[str, Path]]:
    """One detached worktree per name in a temporary folder; removed (and pruned) however the block ends, on
    SIGTERM too."""
    tmp = Path(tempfile.mkdtemp(prefix="gnnscale-bench-"))
    made: list[Path] = []
    old = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        paths = {}
        for name, sha in hashes.items():
            path = tmp / name
            subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", "-q", str(path), sha], check=True)
            made.append(path)
            paths[name] = path
        yield paths
    finally:
        for path in made:
            subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(path)], check=False)
        subprocess.run(["git", "-C", str(repo), "worktree", "prune"], check=False)
        shutil.rmtree(tmp, ignore_errors=True)
        signal.signal(signal.SIGTERM, old)


@contextlib.contextmanager
def source_tree(repo: Path, from_tree: bool) -> Iterator[tuple[Path, str, str | None]]:
    """``(folder the children import from, revision label, why a worktree)``: a clean worktree of HEAD when
    gnnscale/ or benchmarks/ have uncommitted changes, so every record names a clean commit; ``from_tree`` runs
    the working tree and labels the revision ``<hash>-dirty``."""
    sha = resolve(repo, "HEAD")
    changed = changed_paths(repo)
    if not changed or from_tree:
        yield repo, sha[:12] + ("-dirty" if changed else ""), None
        return
    with worktrees(repo, {"head": sha}) as trees:
        yield trees["head"], sha[:12], f"uncommitted changes in {', '.join(changed[:5])}"
