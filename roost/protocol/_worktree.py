"""Detached git worktrees for ``thread/start`` with ``workspace: worktree`` (and worktree forks).

app-server-protocol.md, "Session methods": a worktree session runs in a new detached Git worktree
of the project, created from ``base_revision`` (a branch, tag or commit; the project's HEAD when
omitted) without checking anything out in the project. A request that cannot be honoured (outside
a Git repository, an unknown revision) fails without creating a session or a worktree.

All functions here are blocking (they run ``git``); call them with ``trio.to_thread.run_sync``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from roost._paths import roost_home
from roost.errors import InvalidParams

__all__ = ["create_worktree", "remove_worktree", "remove_clean_worktree", "GIT_TIMEOUT"]

#: Seconds one ``git`` command may take.
GIT_TIMEOUT = 60.0


def _git(cwd: Path, *args: str) -> str:
    """Run ``git args`` in ``cwd``; return stdout stripped.

    Raises:
        InvalidParams: git failed (the message carries git's own words) or is not installed.
    """
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=GIT_TIMEOUT)
    except FileNotFoundError:
        raise InvalidParams("git is not installed; workspace worktree needs it") from None
    except subprocess.TimeoutExpired:
        raise InvalidParams(f"git {' '.join(args)} took longer than {GIT_TIMEOUT:.0f} s") from None
    if out.returncode != 0:
        raise InvalidParams(f"git {' '.join(args)} failed: {out.stderr.strip() or out.stdout.strip()}")
    return out.stdout.strip()


def create_worktree(cwd: Path, base_revision: str | None, name: str) -> dict:
    """Create a detached worktree of the repository containing ``cwd``.

    The worktree lives at ``$ROOST_HOME/worktrees/<name>``; the project's own checkout is not
    touched (``git worktree add --detach``).

    Args:
        cwd: a directory inside the project.
        base_revision: a branch, tag or commit; ``None`` means the project's HEAD.
        name: the worktree directory name (the thread id).

    Returns:
        ``{"path", "base_commit", "base_repository", "base_revision"}``.

    Raises:
        InvalidParams: ``cwd`` is not in a git repository, the revision is unknown, or git could
            not add the worktree. In every case nothing was created.
    """
    try:
        repo = Path(_git(cwd, "rev-parse", "--show-toplevel"))
    except InvalidParams:
        raise InvalidParams(f"{cwd} is not inside a git repository; workspace worktree needs one") from None
    revision = base_revision or "HEAD"
    if revision.startswith("-"):
        raise InvalidParams(f"unknown base_revision {revision!r}")
    try:
        commit = _git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{revision}^{{commit}}")
    except InvalidParams:
        raise InvalidParams(f"unknown base_revision {revision!r} in {repo}") from None
    path = roost_home() / "worktrees" / name
    if path.exists():
        raise InvalidParams(f"worktree path {path} already exists")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        _git(repo, "worktree", "add", "--detach", str(path), commit)
    except InvalidParams:
        shutil.rmtree(path, ignore_errors=True)
        _prune(repo)
        raise
    return {"path": str(path), "base_commit": commit, "base_repository": str(repo), "base_revision": revision}


def remove_worktree(info: dict) -> None:
    """Undo :func:`create_worktree` (used when the session could not be created after all).

    Best effort: errors are swallowed, the directory is removed either way.
    """
    path = Path(info["path"])
    repo = Path(info["base_repository"])
    try:
        _git(repo, "worktree", "remove", "--force", str(path))
    except InvalidParams:
        pass
    shutil.rmtree(path, ignore_errors=True)
    _prune(repo)


def remove_clean_worktree(info: dict) -> bool:
    """Remove a thread's worktree if it holds no modified or untracked files (``thread/delete``).

    Returns:
        True if it was removed (or was already gone); False when git refused because of local
        changes, which are then left exactly as they were.
    """
    path = Path(info["path"])
    if not path.exists():
        _prune(Path(info["base_repository"]))
        return True
    try:
        _git(Path(info["base_repository"]), "worktree", "remove", str(path))
    except InvalidParams:
        return False
    return True


def _prune(repo: Path) -> None:
    try:
        _git(repo, "worktree", "prune")
    except InvalidParams:
        pass
