"""A resumed task's prompt says what happened (issue 13): which process of which node ran it, how
it stopped (released its lease, died, lost its lease), and who resumes it, on both backends. The
claims record it in the task's payload (``claimedBy``, ``claimedNode``, ``resumedFrom``); the
resumed turn's prompt is :func:`roost.actors._task_model.resume_prompt` of that. End to end:
tests/test_pg_cluster.py (kill -9 and SIGSTOP of the running node) and tests/test_serve.py (one
daemon killed and restarted)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import roost.storage as storage
from roost.actors._task_model import QueuedTask, resume_prompt
from roost.storage import claim_daemon_task, enqueue_daemon_task


def _dead_owner() -> str:
    """The owner id of a process of this host that has exited."""
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return f"{socket.gethostname()}:{int(child.stdout)}:n"


def _claim(store, owner: str, node: str, ttl: float = 10.0):
    with store.transaction() as conn:
        return claim_daemon_task(conn, owner, ttl, node=node)


def _resumed_prompt(store, owner: str, node: str) -> tuple[dict, str]:
    claimed = _claim(store, owner, node)
    assert claimed is not None and claimed[2] is True
    task = QueuedTask.from_row(claimed[0])
    assert (task.claimed_by, task.claimed_node) == (owner, node)
    return task.resumed_from, resume_prompt(task)


def _enqueue(store) -> None:
    with store.transaction() as conn:
        enqueue_daemon_task(conn, payload={"task": "write the report"}, id="thr_1")


def test_a_node_that_stopped_and_one_that_resumes_it_elsewhere(backend) -> None:
    _enqueue(backend)
    first = _claim(backend, "hostA:1:a", "hostA:/srv/a")
    assert first is not None and first[2] is False
    assert first[0].payload["claimedBy"] == "hostA:1:a" and first[0].payload["resumedFrom"] is None
    with backend.transaction() as conn:
        storage.release(conn, first[1])  # a clean stop releases the task's lease
    previous, prompt = _resumed_prompt(backend, "hostB:2:b", "hostB:/srv/b")
    assert previous == {"owner": "hostA:1:a", "node": "hostA:/srv/a", "reason": "stopped"}
    assert prompt.startswith("Node hostA:/srv/a (process hostA:1:a) stopped while you were working on this task; "
                             "node hostB:/srv/b (process hostB:2:b) resumes it.")
    assert prompt.endswith("The task: write the report")


def test_a_node_that_lost_its_lease(backend) -> None:
    _enqueue(backend)
    assert _claim(backend, "hostA:1:a", "hostA:/srv/a", ttl=0.05) is not None
    time.sleep(0.2)  # its lease expires unrenewed (paused, or cut off from the database)
    previous, prompt = _resumed_prompt(backend, "hostB:2:b", "hostB:/srv/b")
    assert previous == {"owner": "hostA:1:a", "node": "hostA:/srv/a", "reason": "lease_lost"}
    assert prompt.startswith("Node hostA:/srv/a (process hostA:1:a) lost its lease")
    assert "node hostB:/srv/b (process hostB:2:b) resumes it" in prompt


def test_a_process_of_the_same_node_that_died(backend) -> None:
    _enqueue(backend)
    dead = _dead_owner()
    node = f"{socket.gethostname()}:/home/roost"
    assert _claim(backend, dead, node, ttl=60.0) is not None
    me = f"{socket.gethostname()}:{os.getpid()}:m"
    previous, prompt = _resumed_prompt(backend, me, node)
    assert previous == {"owner": dead, "node": node, "reason": "died"}
    assert prompt.startswith(f"Process {dead} of this daemon (node {node}) died (its process is gone) "
                             f"while you were working on this task; process {me} of the same node resumes it.")


def test_the_same_process_claiming_it_again(backend) -> None:
    _enqueue(backend)
    claimed = _claim(backend, "hostA:1:a", "hostA:/srv/a")
    with backend.transaction() as conn:
        storage.release(conn, claimed[1])  # its task queue restarted (the runner released the lease)
    previous, prompt = _resumed_prompt(backend, "hostA:1:a", "hostA:/srv/a")
    assert previous == {"owner": "hostA:1:a", "node": "hostA:/srv/a", "reason": "stopped"}
    assert prompt.startswith("The task queue of this daemon (node hostA:/srv/a, process hostA:1:a) restarted")


def test_a_task_claimed_before_claims_were_recorded() -> None:
    task = QueuedTask(id="thr_1", task="t", resumed=True, claimed_by="h:2:b", claimed_node="h:/b")
    assert resume_prompt(task).startswith("The daemon that ran this task stopped while you were working on it; "
                                          "node h:/b (process h:2:b) resumes it.")


def test_a_dead_process_whose_lease_a_restart_released_already(backend) -> None:
    _enqueue(backend)
    dead = _dead_owner()
    claimed = _claim(backend, dead, "n:/home", ttl=60.0)
    with backend.transaction() as conn:
        storage.release(conn, claimed[1])  # what a restarted daemon's reconcile does with it
    previous, prompt = _resumed_prompt(backend, "n:9:new", "n:/home")
    assert previous == {"owner": dead, "node": "n:/home", "reason": "died"}
    assert prompt.startswith(f"Process {dead} of this daemon (node n:/home) died (its process is gone)")
