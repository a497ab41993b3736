"""The actor kernel: mailboxes, tell/ask, lifecycle, crashes, shielded clean-up."""

from __future__ import annotations

import attrs
import pytest
import trio
import trio.testing

from roost.actors import Actor, ActorState, Mailbox, shielded_cleanup
from roost.errors import ActorCrashed, AskTimeout, LifecycleError, MailboxClosed, MailboxFull, NotFound
from _helpers.timing import scaled


@attrs.frozen
class Put:
    value: int


@attrs.frozen
class Get:
    pass


@attrs.frozen
class Block:
    event: trio.Event


@attrs.frozen
class Boom:
    pass


@attrs.frozen
class Missing:
    pass


class Recorder(Actor):
    mailbox_size = 4

    def __init__(self, **kw):
        super().__init__(**kw)
        self.seen: list[int] = []
        self.stopped_cleanly = False

    async def handle(self, message):
        if isinstance(message, Put):
            self.seen.append(message.value)
            return len(self.seen)
        if isinstance(message, Get):
            return list(self.seen)
        if isinstance(message, Block):
            await message.event.wait()
            return "unblocked"
        if isinstance(message, Boom):
            raise RuntimeError("boom")
        if isinstance(message, Missing):
            raise NotFound("no such thing")
        raise TypeError(message)

    async def on_stop(self):
        self.stopped_cleanly = True


async def test_tell_keeps_order_and_ask_replies():
    actor = Recorder()
    async with trio.open_nursery() as nursery:
        ref = await nursery.start(actor.run)
        assert actor.state is ActorState.RUNNING
        for i in range(4):
            ref.tell(Put(i))
        assert await ref.ask(Get()) == [0, 1, 2, 3]
        actor.stop()
    assert actor.state is ActorState.STOPPED
    assert actor.stopped_cleanly


async def test_full_mailbox_raises_without_blocking_sender():
    actor = Recorder()
    release = trio.Event()
    async with trio.open_nursery() as nursery:
        ref = await nursery.start(actor.run)
        ref.tell(Block(release))
        await trio.testing.wait_all_tasks_blocked()
        for i in range(4):
            ref.tell(Put(i))
        with trio.CancelScope() as scope:
            scope.cancel()  # any checkpoint would raise Cancelled: tell must not be one
            with pytest.raises(MailboxFull):
                ref.tell(Put(99))
        assert ref.queued == 4
        release.set()
        await trio.testing.wait_all_tasks_blocked()
        assert await ref.ask(Get(), timeout=scaled(5)) == [0, 1, 2, 3]
        actor.stop()


async def test_ask_timeout_is_typed(autojump_clock):
    actor = Recorder()
    never = trio.Event()
    async with trio.open_nursery() as nursery:
        ref = await nursery.start(actor.run)
        with pytest.raises(AskTimeout):
            await ref.ask(Block(never), timeout=1.5)  # not a deadline
        actor.stop()


async def test_expected_errors_are_replies_and_actor_lives_on():
    actor = Recorder()
    async with trio.open_nursery() as nursery:
        ref = await nursery.start(actor.run)
        with pytest.raises(NotFound):
            await ref.ask(Missing())
        assert await ref.ask(Put(1)) == 1
        actor.stop()


async def test_crash_fails_pending_askers_and_propagates():
    actor = Recorder()
    results: list[BaseException] = []

    async def asker(ref, msg):
        try:
            await ref.ask(msg)
        except Exception as exc:
            results.append(exc)

    async with trio.open_nursery() as askers:
        with pytest.RaisesGroup(pytest.RaisesExc(RuntimeError, match="boom"), flatten_subgroups=True):
            async with trio.open_nursery() as nursery:
                ref = await nursery.start(actor.run)
                release = trio.Event()
                ref.tell(Block(release))
                askers.start_soon(asker, ref, Boom())
                await trio.testing.wait_all_tasks_blocked()
                askers.start_soon(asker, ref, Get())
                await trio.testing.wait_all_tasks_blocked()
                release.set()
    assert len(results) == 2 and all(isinstance(e, ActorCrashed) for e in results)
    assert actor.state is ActorState.STOPPED
    with pytest.raises(MailboxClosed):
        actor.ref.tell(Put(1))


async def test_actor_cannot_run_twice():
    actor = Recorder()
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        actor.stop()
    with pytest.raises(LifecycleError):
        await actor.run()


def test_mailbox_must_be_bounded():
    with pytest.raises(ValueError):
        Mailbox(0)


async def test_shielded_cleanup_survives_cancel_and_is_bounded(autojump_clock):
    finished = []
    with trio.CancelScope() as outer:
        try:
            outer.cancel()
            await trio.sleep(1)
        finally:
            with shielded_cleanup(2.0) as scope:
                await trio.sleep(0.5)  # runs although the outer scope is cancelled
                finished.append("short")
                await trio.sleep(10)  # cut short at 2 s
                finished.append("never")
    assert finished == ["short"]
    assert scope.cancelled_caught


async def test_stop_by_cancellation_is_not_a_crash_for_askers():
    """A Cancelled stop answers waiting askers with MailboxClosed, never ActorCrashed(repr)."""
    results: list[BaseException] = []

    async def asker(ref, msg):
        try:
            await ref.ask(msg, timeout=None)
        except Exception as exc:
            results.append(exc)

    # Cancelled from outside (the supervisor's way): the running handler's asker and a queued one.
    actor = Recorder()
    async with trio.open_nursery() as askers:
        with trio.CancelScope() as outer:
            async with trio.open_nursery() as nursery:
                ref = await nursery.start(actor.run)
                askers.start_soon(asker, ref, Block(trio.Event()))
                await trio.testing.wait_all_tasks_blocked()
                askers.start_soon(asker, ref, Get())
                await trio.testing.wait_all_tasks_blocked()
                outer.cancel()
    assert len(results) == 2
    assert all(type(e) is MailboxClosed for e in results), results
    assert not any("Cancelled" in str(e) for e in results)
    assert actor.state is ActorState.STOPPED and actor.stopped_cleanly

    # stop(): the same answers.
    results.clear()
    actor = Recorder()
    async with trio.open_nursery() as askers:
        async with trio.open_nursery() as nursery:
            ref = await nursery.start(actor.run)
            askers.start_soon(asker, ref, Block(trio.Event()))
            await trio.testing.wait_all_tasks_blocked()
            askers.start_soon(asker, ref, Get())
            await trio.testing.wait_all_tasks_blocked()
            actor.stop()
    assert len(results) == 2 and all(type(e) is MailboxClosed for e in results), results
