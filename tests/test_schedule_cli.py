"""`roost schedule ...`: a few runs of the real command, the rest through click in-process."""

from __future__ import annotations

import datetime
import json
import os
import subprocess

from click.testing import CliRunner

from roost.cli._main import main
from roost.storage import _schedules2 as db
from roost.storage import open_store
from _helpers.timing import scaled


def real(cmd, *args, env=None, cwd=None):
    """The real `roost` command in a subprocess."""
    return subprocess.run([*cmd, "schedule", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=scaled(60))


CONFIG = """
Orchestration:
  Name: Team
  Agents:
    - {Name: Solo, Instructions: "You work alone."}
  Selection: {Type: sequential}
  Termination: {Type: maxiterations, MaxIterations: 1}
"""


def cli(*args):
    """The same click command in-process (process start-up costs ~1 s; behaviour is identical)."""
    return CliRunner().invoke(main, ["schedule", *args], catch_exceptions=False)


def items_of(stdout):
    doc = json.loads(stdout)
    assert doc["protocolVersion"] == 1 and stdout.count("\n") == 1
    return doc["items"]


def test_real_command_end_to_end(roost_cmd, tmp_path):
    env = dict(os.environ, TZ="Pacific/Chatham")  # UTC+13:45: the host zone changes nothing
    (tmp_path / "c.yaml").write_text(CONFIG)
    ok = real(roost_cmd, "add", "nightly", "--cron", "0 3 * * *", "--task", "tidy up",
              "--description", "every night", "--work-dir", str(tmp_path), "--config", "c.yaml",
              "--overlap", "queue", "--catch-up", "none", env=env, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    bad = real(roost_cmd, "add", "feb31", "--cron", "0 0 31 2 *", "--task", "t", "--json")
    assert bad.returncode == 1
    assert json.loads(bad.stdout) == {"protocolVersion": 1, "error": "cron '0 0 31 2 *' never fires"}
    listed = real(roost_cmd, "list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    (nightly,) = items_of(listed.stdout)
    assert set(nightly) >= {"name", "description", "cron", "task", "config", "workDir", "enabled", "due",
                            "createdAt", "lastRun", "nextRun"}
    assert (nightly["description"], nightly["cron"], nightly["task"], nightly["config"], nightly["workDir"],
            nightly["enabled"], nightly["due"], nightly["lastRun"]) == (
        "every night", "0 3 * * *", "tidy up", str(tmp_path / "c.yaml"), str(tmp_path), True, False, None)
    assert nightly["nextRun"].endswith("T03:00:00.000000Z") and nightly["createdAt"].endswith("Z")
    assert (nightly["overlap"], nightly["catchUp"]) == ("queue", "none")
    gone = real(roost_cmd, "remove", "nope")
    assert gone.returncode == 1 and "no schedule named 'nope'" in gone.stderr and gone.stdout == ""


def test_add_list_enable_disable_run_remove(monkeypatch):
    monkeypatch.setattr("roost.cli._schedule.CLAIM_WAIT", 0.1)  # no daemon will claim the run
    assert items_of(cli("list", "--json").stdout) == []
    assert cli("add", "nightly", "--cron", "0 3 * * *", "--task", "t").exit_code == 0
    assert cli("add", "each-minute", "--cron", "*/1 * * * *", "--task", "t", "--json").stdout == ""
    items = items_of(cli("list", "--json").stdout)
    assert [i["name"] for i in items] == ["each-minute", "nightly"]  # ordered by next run (then by name: in the minute before 03:00 both are due at 03:00)
    # a schedule belongs to the directory it was added in (issue 17), resolved as `roost serve` does
    assert items[0]["description"] is None and items[0]["config"] is None
    assert items[0]["workDir"] == os.path.realpath(os.getcwd())
    assert cli("disable", "each-minute").exit_code == 0
    disabled = [i for i in items_of(cli("list", "--json").stdout) if i["name"] == "each-minute"]
    assert [i["enabled"] for i in disabled] == [False]
    assert disabled[0]["nextRun"] is None and disabled[0]["due"] is False  # no next run in the past
    assert "each-minute" in cli("list").stdout and "next -" in cli("list").stdout
    assert cli("enable", "each-minute").exit_code == 0
    assert [i["enabled"] for i in items_of(cli("list", "--json").stdout) if i["name"] == "each-minute"] == [True]
    assert cli("run", "each-minute").exit_code == 0
    assert cli("remove", "each-minute").exit_code == 0
    assert [i["name"] for i in items_of(cli("list", "--json").stdout)] == ["nightly"]
    human = cli("list")
    assert human.exit_code == 0 and "nightly" in human.stdout and "0 3 * * *" in human.stdout


def test_failures_exit_1_with_an_error_envelope():
    assert cli("add", "dup", "--cron", "* * * * *", "--task", "t").exit_code == 0
    cases = [
        (["add", "x", "--cron", "0 0 * * * *", "--task", "t"], "exactly 5"),
        (["add", "x", "--cron", "0 0 L * *", "--task", "t"], "unsupported"),
        (["add", "dup", "--cron", "* * * * *", "--task", "t"], "a schedule named 'dup' exists"),
        (["remove", "nope"], "no schedule named 'nope'"),
        (["enable", "nope"], "no schedule named 'nope'"),
        (["disable", "nope"], "no schedule named 'nope'"),
        (["run", "nope"], "no schedule named 'nope'"),
    ]
    for args, message in cases:
        out = cli(*args, "--json")
        assert out.exit_code == 1, args
        doc = json.loads(out.stdout)
        assert set(doc) == {"protocolVersion", "error"} and doc["protocolVersion"] == 1
        assert message in doc["error"]


def test_feb30_monday_rule():
    assert cli("add", "feb", "--cron", "0 0 30 2 1", "--task", "t").exit_code == 0
    (item,) = items_of(cli("list", "--json").stdout)
    next_run = datetime.datetime.fromisoformat(item["nextRun"].replace("Z", "+00:00"))
    assert next_run.month == 2 and next_run.weekday() == 0  # a Monday of February (vixie OR)


def test_due_last_run_and_an_old_unparsable_row(roost_home):
    assert cli("add", "ok", "--cron", "* * * * *", "--task", "t").exit_code == 0
    store = open_store(roost_home / "roost.db")
    try:
        with store.transaction() as conn:
            conn.execute("UPDATE schedules SET next_run = '2020-01-01T00:00:00.000000Z' WHERE name = 'ok'")
            job = db.get_job(conn, "ok")
            run_id = db.claim_slot(conn, job.id, "2019-12-31T23:59:00.000000Z", "x")
            db.mark_run_started(conn, run_id, "task_9", "2019-12-31T23:59:01.000000Z")
            conn.execute(
                """INSERT INTO schedules (id, name, cron, created_at, updated_at, task, next_run)
                   VALUES ('s_old', 'old', '0 0 31 2 *', '2019-01-01T00:00:00.000000Z',
                           '2019-01-01T00:00:00.000000Z', 'legacy', NULL)""")
    finally:
        store.close()
    items = {i["name"]: i for i in items_of(cli("list", "--json").stdout)}
    assert items["ok"]["due"] is True and items["ok"]["lastRun"] == "2019-12-31T23:59:01.000000Z"
    assert items["old"]["nextRun"] is None and items["old"]["due"] is False
    assert cli("disable", "ok").exit_code == 0
    assert {i["name"]: i["due"] for i in items_of(cli("list", "--json").stdout)}["ok"] is False
    assert cli("enable", "old").exit_code == 0  # enabled, but it can never be due
    assert {i["name"]: i["due"] for i in items_of(cli("list", "--json").stdout)}["old"] is False


def test_add_refuses_a_work_dir_that_is_not_a_directory(roost_cmd, tmp_path):
    # the real command: a missing --work-dir or a file is refused (exit 1, nothing stored); an
    # existing directory given relatively is stored as an absolute path
    missing = tmp_path / "nonexistent" / "dir"
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    gone = real(roost_cmd, "add", "lost", "--cron", "0 3 * * *", "--task", "t", "--work-dir", str(missing))
    assert gone.returncode == 1 and gone.stdout == ""
    assert gone.stderr == f"roost schedule add: invalid --work-dir: {missing} does not exist\n"
    filed = real(roost_cmd, "add", "filed", "--cron", "0 3 * * *", "--task", "t", "--work-dir", "file.txt",
                 "--json", cwd=tmp_path)
    assert filed.returncode == 1
    assert json.loads(filed.stdout) == {"protocolVersion": 1,
                                        "error": f"invalid --work-dir: {a_file} is not a directory"}
    assert items_of(real(roost_cmd, "list", "--json").stdout) == []
    (tmp_path / "sub").mkdir()
    ok = real(roost_cmd, "add", "here", "--cron", "0 3 * * *", "--task", "t", "--work-dir", "sub", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    (item,) = items_of(real(roost_cmd, "list", "--json").stdout)
    assert item["workDir"] == str(tmp_path / "sub")


def test_add_prints_the_same_lower_case_message_with_and_without_a_config(tmp_path):
    (tmp_path / "c.yaml").write_text(CONFIG)
    plain = cli("add", "nightly", "--cron", "0 3 * * *", "--task", "t")
    team = cli("add", "team", "--cron", "0 4 * * *", "--task", "t", "--config", str(tmp_path / "c.yaml"),
               "--work-dir", str(tmp_path))
    assert plain.exit_code == 0 and team.exit_code == 0
    assert plain.stdout.startswith("added nightly: next run ") and plain.stdout.endswith("T03:00:00.000000Z\n")
    assert team.stdout.startswith("added team: next run ") and team.stdout.endswith("T04:00:00.000000Z\n")
    assert plain.stderr == team.stderr == ""


def test_run_says_the_request_waits_for_a_daemon_when_none_runs(monkeypatch, roost_home):
    # no `roost serve` for this ROOST_HOME: the request is stored; one line on stderr says so.
    # (A stale lock file without its socket, and an unlocked one, are no daemon either.)
    run = roost_home / "run"
    run.mkdir()
    (run / "gone.sock.lock").write_text("")
    (run / "idle.sock.lock").write_text("")
    (run / "idle.sock").write_text("")
    monkeypatch.setattr("roost.cli._schedule.CLAIM_WAIT", 0.3)
    assert cli("add", "nightly", "--cron", "0 3 * * *", "--task", "t").exit_code == 0
    fired = cli("run", "nightly")
    assert fired.exit_code == 0 and fired.stdout == ""
    assert fired.stderr == ("run of nightly requested; no roost serve is running: it starts when one does\n")
    as_json = cli("run", "nightly", "--json")  # --json: unchanged, nothing printed on success
    assert as_json.exit_code == 0 and as_json.stdout == "" and as_json.stderr == ""
    store = open_store(roost_home / "roost.db")
    try:
        with store.read() as conn:
            assert [r.slot.startswith("manual:") for r in db.list_requested_runs(conn)] == [True, True]
    finally:
        store.close()


def test_add_refuses_an_empty_or_blank_task(roost_cmd):
    # the real command: a task of "" or only spaces would make every run fail; it is refused
    # (exit 1 like the other add errors, nothing stored)
    for task in ["", "   "]:
        done = real(roost_cmd, "add", "nightly", "--cron", "0 0 * * *", "--task", task)
        assert done.returncode == 1 and done.stdout == "", task
        assert done.stderr == "roost schedule add: the --task must not be empty: it is the text each run starts with\n"
    envelope = real(roost_cmd, "add", "nightly", "--cron", "0 0 * * *", "--task", " ", "--json")
    assert envelope.returncode == 1 and "--task must not be empty" in json.loads(envelope.stdout)["error"]
    assert items_of(real(roost_cmd, "list", "--json").stdout) == []


def test_remove_enable_disable_confirm_in_one_line_and_json_stays_silent(roost_cmd, roost_home):
    assert real(roost_cmd, "add", "tidy", "--cron", "0 3 * * *", "--task", "t").returncode == 0
    disabled = real(roost_cmd, "disable", "tidy")
    assert (disabled.returncode, disabled.stdout) == (0, "disabled tidy (a run in progress is not stopped)\n")
    enabled = real(roost_cmd, "enable", "tidy")
    assert enabled.returncode == 0 and enabled.stdout.startswith("enabled tidy: next run ")
    assert enabled.stdout.count("\n") == 1 and enabled.stdout.rstrip().endswith("T03:00:00.000000Z")
    for command in ("disable", "enable"):  # --json: success is the exit status alone (wire.md)
        quiet = real(roost_cmd, command, "tidy", "--json")
        assert (quiet.returncode, quiet.stdout) == (0, "")
    removed = real(roost_cmd, "remove", "tidy")
    assert (removed.returncode, removed.stdout) == (0, "removed tidy\n")
    assert real(roost_cmd, "add", "again", "--cron", "0 3 * * *", "--task", "t").returncode == 0
    quiet = real(roost_cmd, "remove", "again", "--json")
    assert (quiet.returncode, quiet.stdout) == (0, "")


def test_list_columns_are_as_wide_as_their_content(roost_cmd, roost_home):
    """A fresh-user trial saw `*/15 9-17 * * mon-fri` run into `enabled` (the cron column was a
    fixed 16 characters): every column now starts at the same place on every line, two spaces
    after the widest cell before it."""
    jobs = [("a", "*/15 9-17 * * mon-fri", "check"), ("a-much-longer-name-than-twenty", "0 3 * * *", "tidy")]
    for name, cron, task in jobs:
        assert real(roost_cmd, "add", name, "--cron", cron, "--task", task).returncode == 0
    assert real(roost_cmd, "disable", "a").returncode == 0  # "disabled" is wider than "enabled"
    listed = real(roost_cmd, "list")
    assert listed.returncode == 0, listed.stderr
    lines = {line.split()[0]: line for line in listed.stdout.splitlines()}
    assert set(lines) == {"a", "a-much-longer-name-than-twenty"}
    short, long_ = lines["a"], lines["a-much-longer-name-than-twenty"]
    assert short.index("*/15 9-17 * * mon-fri  disabled") == long_.index("0 3 * * *") == len(long_.split()[0]) + 2
    assert short.index("disabled") == long_.index("enabled")
    assert short.index("next ") == long_.index("next ") and short.index("last ") == long_.index("last ")
    assert short.index(" in ") == long_.index(" in ")
