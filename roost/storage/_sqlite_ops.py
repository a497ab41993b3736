"""The SQLite implementation of the store interface: the module functions of this room as methods."""

from __future__ import annotations

from . import _bus, _items, _memory, _objectives, _processes, _queries, _schedules2, _tasks, _threads, _workers, leases

__all__ = ["SQLiteOperations"]


class SQLiteOperations(_bus.BusOperations):
    """Every operation of :class:`roost.storage.StoreBackend`, bound to the SQLite module functions.

    :class:`roost.storage.Store` inherits these, so ``store.get_thread(conn, thread_id)`` is
    ``roost.storage.get_thread(conn, thread_id)``. Each is a staticmethod: the connection is the
    first argument, as for the module functions. The node bus operations are one implementation
    for both backends (:class:`roost.storage._bus.BusOperations`).
    """

    # _items
    append_item = staticmethod(_items.append_item)
    get_item = staticmethod(_items.get_item)
    list_items = staticmethod(_items.list_items)
    update_item = staticmethod(_items.update_item)
    search_items = staticmethod(_items.search_items)
    add_held_input = staticmethod(_items.add_held_input)
    list_held_input = staticmethod(_items.list_held_input)
    update_held_input = staticmethod(_items.update_held_input)
    remove_held_input = staticmethod(_items.remove_held_input)
    # _memory
    put_memory = staticmethod(_memory.put_memory)
    get_memory = staticmethod(_memory.get_memory)
    list_memory = staticmethod(_memory.list_memory)
    delete_memory = staticmethod(_memory.delete_memory)
    put_context_file = staticmethod(_memory.put_context_file)
    list_context_files = staticmethod(_memory.list_context_files)
    delete_context_file = staticmethod(_memory.delete_context_file)
    # _objectives
    create_objective = staticmethod(_objectives.create_objective)
    get_objective = staticmethod(_objectives.get_objective)
    list_objectives = staticmethod(_objectives.list_objectives)
    set_objective_status = staticmethod(_objectives.set_objective_status)
    add_objective_task = staticmethod(_objectives.add_objective_task)
    start_objective_task = staticmethod(_objectives.start_objective_task)
    finish_objective_task = staticmethod(_objectives.finish_objective_task)
    # _processes
    record_tool_process = staticmethod(_processes.record_tool_process)
    forget_tool_process = staticmethod(_processes.forget_tool_process)
    list_tool_processes = staticmethod(_processes.list_tool_processes)
    # _queries
    first_user_text = staticmethod(_queries.first_user_text)
    latest_run_status = staticmethod(_queries.latest_run_status)
    count_turns = staticmethod(_queries.count_turns)
    chat_ids_with_title = staticmethod(_queries.chat_ids_with_title)
    page_threads = staticmethod(_queries.page_threads)
    chat_threads_with_cwd = staticmethod(_queries.chat_threads_with_cwd)
    queued_worker_roots = staticmethod(_queries.queued_worker_roots)
    mark_worker_delivered = staticmethod(_queries.mark_worker_delivered)
    adopt_schedule_run = staticmethod(_queries.adopt_schedule_run)
    schedule_run_status = staticmethod(_queries.schedule_run_status)
    memory_value = staticmethod(_queries.memory_value)
    memory_scope_counts = staticmethod(_queries.memory_scope_counts)
    delete_memory_prefix = staticmethod(_queries.delete_memory_prefix)
    scope_has_memory = staticmethod(_queries.scope_has_memory)
    # _schedules2
    bump_schedule_changes = staticmethod(_schedules2.bump_schedule_changes)
    schedule_changes = staticmethod(_schedules2.schedule_changes)
    add_job = staticmethod(_schedules2.add_job)
    get_job = staticmethod(_schedules2.get_job)
    list_jobs = staticmethod(_schedules2.list_jobs)
    adopt_job = staticmethod(_schedules2.adopt_job)
    remove_job = staticmethod(_schedules2.remove_job)
    set_job_enabled = staticmethod(_schedules2.set_job_enabled)
    advance_next_run = staticmethod(_schedules2.advance_next_run)
    request_run = staticmethod(_schedules2.request_run)
    list_requested_runs = staticmethod(_schedules2.list_requested_runs)
    claim_requested_run = staticmethod(_schedules2.claim_requested_run)
    claim_slot = staticmethod(_schedules2.claim_slot)
    record_skipped = staticmethod(_schedules2.record_skipped)
    mark_run_started = staticmethod(_schedules2.mark_run_started)
    mark_run_finished = staticmethod(_schedules2.mark_run_finished)
    has_running_run = staticmethod(_schedules2.has_running_run)
    list_open_runs = staticmethod(_schedules2.list_open_runs)
    list_job_runs = staticmethod(_schedules2.list_job_runs)
    # _tasks
    enqueue_daemon_task = staticmethod(_tasks.enqueue_daemon_task)
    get_daemon_task = staticmethod(_tasks.get_daemon_task)
    list_daemon_tasks = staticmethod(_tasks.list_daemon_tasks)
    update_daemon_task = staticmethod(_tasks.update_daemon_task)
    # _threads
    create_thread = staticmethod(_threads.create_thread)
    get_thread = staticmethod(_threads.get_thread)
    list_threads = staticmethod(_threads.list_threads)
    update_thread = staticmethod(_threads.update_thread)
    delete_thread = staticmethod(_threads.delete_thread)
    create_turn = staticmethod(_threads.create_turn)
    get_turn = staticmethod(_threads.get_turn)
    list_turns = staticmethod(_threads.list_turns)
    update_turn = staticmethod(_threads.update_turn)
    create_run = staticmethod(_threads.create_run)
    get_run = staticmethod(_threads.get_run)
    list_runs = staticmethod(_threads.list_runs)
    update_run = staticmethod(_threads.update_run)
    # _workers
    create_worker = staticmethod(_workers.create_worker)
    get_worker = staticmethod(_workers.get_worker)
    list_workers = staticmethod(_workers.list_workers)
    update_worker = staticmethod(_workers.update_worker)
    claim_queued_worker = staticmethod(_workers.claim_queued_worker)
    # leases
    acquire = staticmethod(leases.acquire)
    acquire_then = staticmethod(leases.acquire_then)
    renew = staticmethod(leases.renew)
    release = staticmethod(leases.release)
    hand_over = staticmethod(leases.hand_over)
    check_fence = staticmethod(leases.check_fence)
    get_lease = staticmethod(leases.get_lease)

    def bus_listener(self, node_id: str) -> None:
        """No listener on SQLite: nodes poll (:class:`roost.actors.NodeBus`)."""
        return None
