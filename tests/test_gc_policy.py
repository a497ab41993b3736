"""The servers' garbage-collector policy (roost._gc; issue 19): behaviour, not timing."""

from __future__ import annotations

import gc

import pytest

from roost._gc import SERVER_GC_THRESHOLDS, apply_server_gc_policy


@pytest.fixture
def restore_gc():
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_the_policy_freezes_start_up_and_raises_the_thresholds(restore_gc, monkeypatch) -> None:
    monkeypatch.delenv("ROOST_GC", raising=False)
    assert apply_server_gc_policy() is True
    assert gc.get_threshold() == SERVER_GC_THRESHOLDS
    assert gc.get_freeze_count() > 0


def test_roost_gc_default_leaves_the_collector_alone(restore_gc, monkeypatch) -> None:
    monkeypatch.setenv("ROOST_GC", "default")
    before = gc.get_threshold()
    assert apply_server_gc_policy() is False
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
