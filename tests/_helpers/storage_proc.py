"""A separate OS process that uses a Roost store, for the cross-process store and lease tests.

Usage (one line of output per event, flushed, so the parent synchronises on them); DB is a SQLite
file or a ``postgresql://`` URL:

    storage_proc.py writer DB THREAD_ID     append items in groups forever; "committed N" per group
    storage_proc.py race DB KEY OWNER       wait for "go" on stdin, acquire; "won TOKEN" or "held"
    storage_proc.py holder DB KEY THREAD_ID TTL
        hold KEY through a LeaseKeeper; "acquired TOKEN"; one fenced item write: "wrote SEQ";
        then "renewed" after each renewal until the lease is lost; then "lost REASON"; then one
        more fenced write attempt after the loss: "stale-write-refused" (or "stale-write-ACCEPTED").
"""

from __future__ import annotations

import sys

import trio

from roost.errors import LeaseHeld, StaleLease
from roost.storage import LeaseKeeper, PostgresStore, acquire, append_item, connect, open_backend, open_store


def open_any(db: str):
    """DB is a SQLite file or a postgresql:// URL (the lease tests run on both backends)."""
    return open_backend(db) if db.startswith("postgresql://") else open_store(db)


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def writer(db: str, thread_id: str) -> None:
    store = open_any(db)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.writer.run)
        total = 0
        while True:
            for i in range(199):
                store.writer.submit_nowait(append_item, thread_id, type="user_message",
                                           payload={"n": total + i, "pad": "x" * 200},
                                           text=f"message number {total + i}")
            await store.writer.submit(append_item, thread_id, type="user_message", payload={},
                                      text="group end")
            total += 200
            say(f"committed {total}")


def race(db: str, key: str, owner: str) -> None:
    if db.startswith("postgresql://"):
        import psycopg

        pg = psycopg.connect(db, autocommit=True)
        take = lambda: PostgresStore.acquire(pg, key, owner, 30.0)  # noqa: E731
    else:
        conn = connect(db)
        take = lambda: acquire(conn, key, owner, 30.0)  # noqa: E731
    say("ready")
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("expected go")
    try:
        lease = take()
    except LeaseHeld:
        say("held")
    else:
        say(f"won {lease.token}")


async def holder(db: str, key: str, thread_id: str, ttl: float) -> None:
    store = open_any(db)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.writer.run)
        keeper = LeaseKeeper(store.writer, owner="holder-process")
        await nursery.start(keeper.run)
        async with keeper.hold(key, ttl=ttl) as execution:
            say(f"acquired {execution.lease.token}")
            with execution.cancel_scope:
                item = await execution.submit(store.append_item, thread_id, type="agent_message",
                                              payload={"by": "holder"}, text="before the pause")
                say(f"wrote {item.seq}")
                while True:
                    await execution.renewed.wait()
                    say("renewed")
            say(f"lost {execution.lost_reason}")
            try:
                await execution.submit(store.append_item, thread_id, type="agent_message",
                                       payload={"by": "holder"}, text="after the loss")
            except StaleLease:
                say("stale-write-refused")
            else:
                say("stale-write-ACCEPTED")
        nursery.cancel_scope.cancel()


def main() -> None:
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "writer":
        trio.run(writer, *args)
    elif mode == "race":
        race(*args)
    elif mode == "holder":
        trio.run(holder, args[0], args[1], args[2], float(args[3]))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
