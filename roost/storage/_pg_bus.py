"""The node bus's wake-up on PostgreSQL: a ``LISTEN`` connection per node.

The bus itself (rows, states, the ``NOTIFY`` sent by ``post_message``) is one implementation for
both backends, :mod:`roost.storage._bus`. This is the PostgreSQL-only part: a dedicated connection
that waits for notifications on :data:`~roost.storage._bus.CHANNEL`
(https://www.postgresql.org/docs/15/sql-listen.html).
"""

from __future__ import annotations

from ._bus import CHANNEL
from ._pg_listen import PgListener

__all__ = ["PgBusListener"]


class PgBusListener(PgListener):
    """A :class:`~roost.storage._pg_listen.PgListener` on the bus channel for one node.

    :meth:`wait` returns True when a notification whose payload starts with ``node_id`` (the
    message's target, ``"<node id> ..."``) arrives, False after ``timeout`` seconds or
    :meth:`close`. Raises as :class:`~roost.storage._pg_listen.PgListener`.
    """

    def __init__(self, url: str, node_id: str) -> None:
        self.node_id = node_id
        super().__init__(url, CHANNEL, lambda payload: payload.split(" ", 1)[0] == node_id)
