"""End-to-end: configuration reload (``config/error`` / ``config/changed``) and hosted mode
(``--host cloud``), through the real ``roost app-server`` subprocess."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import trio
from _helpers.appserver import expect_error, open_app_server, roost_argv
from _helpers.timing import scaled

SCRIPT = "rules: []\ndefault: echo\n"


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROOST_")}
    env["ROOST_HOME"] = str(home)
    return env


def _config(script: Path) -> str:
    return f'[provider]\nname = "scripted"\nscript = "{script}"\n'


@pytest.fixture
def scripts(tmp_path: Path) -> tuple[Path, Path]:
    one, two = tmp_path / "one.yaml", tmp_path / "two.yaml"
    one.write_text(SCRIPT)
    two.write_text(SCRIPT)
    return one, two


async def test_config_reload_error_and_repair(tmp_path: Path, roost_home: Path, scripts) -> None:
    one, two = scripts
    config = roost_home / "config.toml"
    good = _config(one)
    config.write_text(good)
    async with open_app_server(env=_env(roost_home), cwd=tmp_path) as client:
        init = await client.initialize()
        assert init["status"] == "ready" and init["model"]["script"] == str(one)
        thread = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]

        config.write_text("[provider\nname = ")  # not TOML
        error = await client.wait_for("config/error")
        assert error["path"] == str(config) and "TOML" in error["message"]
        # the previous inventory stays for display ...
        again = await client.request("initialize", {})
        assert again["status"] == "needs_setup" and again["model"]["script"] == str(one)
        listed = await client.request("engine/list", {"include_models": False})
        assert listed["engines"][0]["providers"][0]["script"] == str(one)
        # ... but not for execution or mutations
        await expect_error(client, "turn/start", {"thread_id": thread["id"], "prompt": "hi"}, "invalid_params",
                           contains="configuration file was rejected")
        await expect_error(client, "config/model/update", {"model": "m"}, "invalid_params",
                           contains="configuration file was rejected")

        config.write_text("[provider\nname = ")  # the same rejected document: no repeated error
        config.write_text('[provider]\nname = "nope"\n')  # a different rejected document
        second = await client.wait_for("config/error", lambda p: "nope" in p["message"])
        assert "unknown provider" in second["message"]
        assert len(client.notifications("config/error")) == 2

        start = len(client.lines)
        config.write_text(good)  # restored to the previous contents
        changed = await client.wait_for("config/changed", start=start)
        assert changed["status"] == "ready" and changed["model"]["script"] == str(one)
        assert changed["providers"][0]["default"] is True
        done = await client.run_turn(thread["id"], "hello again")
        assert done["turn"]["status"] == "completed"
        assert (await client.request("initialize", {}))["status"] == "ready"

        start = len(client.lines)
        config.write_text(_config(two))  # a different valid selection
        changed = await client.wait_for("config/changed", start=start)
        assert changed["model"]["script"] == str(two)
        assert (await client.request("initialize", {}))["model"]["script"] == str(two)


def _cloud_args(tmp_path: Path, config: Path) -> tuple[str, ...]:
    return ("--host", "cloud", "--instance-id", "instance_123", "--workspace-id", "workspace_123",
            "--workdir", str(tmp_path), "--config", str(config))


async def test_cloud_mode_identity_and_explicit_config(tmp_path: Path, roost_home: Path, scripts) -> None:
    one, two = scripts
    (roost_home / "config.toml").write_text(_config(two))  # ambient state: ignored in cloud mode
    config = tmp_path / "run" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps({"provider": {"name": "scripted", "script": str(one)}}))
    env = _env(roost_home)
    env["ROOST_SCRIPT"] = str(two)  # ambient too
    async with open_app_server(env=env, cwd=roost_home, args=_cloud_args(tmp_path, config)) as client:
        init = await client.initialize()
        assert init["runtime_host"] == {"kind": "cloud", "instance_id": "instance_123",
                                        "workspace_id": "workspace_123"}
        assert init["workspace"] == {"root": str(tmp_path), "id": "workspace_123"}
        assert init["status"] == "ready" and init["model"]["script"] == str(one)
        thread = (await client.request("thread/start", {}))["thread"]
        assert thread["cwd"] == str(tmp_path) and thread["workspace_id"] == "workspace_123"
        config.write_text("{not json")
        error = await client.wait_for("config/error")
        assert "JSON" in error["message"]


async def test_cloud_mode_without_config_is_not_set_up_from_ambient_state(tmp_path: Path, roost_home: Path,
                                                                          scripts) -> None:
    one, _ = scripts
    config = tmp_path / "config.toml"
    config.write_text("")  # explicit, but selects nothing
    env = _env(roost_home)
    env.update(ROOST_PROVIDER="scripted", ROOST_SCRIPT=str(one))
    async with open_app_server(env=env, args=_cloud_args(tmp_path, config)) as client:
        init = await client.initialize()
        assert init["status"] == "needs_setup" and init["model"] is None
    assert not (roost_home / "config.toml").exists()


def test_cloud_mode_names_every_missing_option(tmp_path: Path, roost_home: Path) -> None:
    done = subprocess.run([*roost_argv(), "app-server", "--host", "cloud", "--instance-id", "i"],
                          check=False, env=_env(roost_home), input=b"", capture_output=True, timeout=scaled(60))
    assert done.returncode == 2
    err = done.stderr.decode()
    assert "--workspace-id, --workdir, --config" in err and "--instance-id," not in err
    assert "Traceback" not in err and done.stdout == b""


async def _watcher_live(client, config: Path, good: str) -> None:
    """Edit ``good`` (comments only) until a ``config/changed`` shows the watcher saw the edit (an
    edit made before the watcher primed is its starting document)."""
    for i in range(20):
        config.write_text(good + f"# edit {i}\n")
        with trio.move_on_after(scaled(1)):
            await client.wait_for("config/changed")
            return
    raise AssertionError("the configuration watcher never reported an edit")


UNKNOWN_FIELDS = [
    ('[provider]\nname = "scripted"\nmodle = "x"\n', "[provider]", "'modle'"),
    ('bogus_top = 1\n[provider]\nname = "scripted"\n', "top-level key", "'bogus_top'"),
    ('[provider]\nname = "scripted"\n[bogus_table]\n', "unknown table", "[bogus_table]"),
]


@pytest.mark.parametrize(("text", "where", "key"), UNKNOWN_FIELDS)
async def test_unknown_fields_are_refused_at_start_and_on_reload(tmp_path: Path, roost_home: Path, scripts,
                                                                 text: str, where: str, key: str) -> None:
    one, _ = scripts
    config = roost_home / "config.toml"
    good = _config(one)
    config.write_text(text)
    async with open_app_server(env=_env(roost_home), cwd=tmp_path) as client:  # at start
        init = await client.initialize()
        assert init["status"] == "needs_setup" and where in init["issues"][0] and key in init["issues"][0]
        error = await client.wait_for("config/error")
        assert error["path"] == str(config) and key in error["message"] and "known" in error["message"]
    config.write_text(good)
    async with open_app_server(env=_env(roost_home), cwd=tmp_path) as client:  # on reload
        assert (await client.initialize())["status"] == "ready"
        await _watcher_live(client, config, good)
        config.write_text(text)
        error = await client.wait_for("config/error")
        assert where in error["message"] and key in error["message"]
        assert len(client.notifications("config/changed")) == 1
        assert (await client.request("initialize", {}))["status"] == "needs_setup"


async def test_reload_checks_mcp_servers_as_start_up_does(tmp_path: Path, roost_home: Path, scripts) -> None:
    one, _ = scripts
    config = roost_home / "config.toml"
    config.write_text(_config(one))
    async with open_app_server(env=_env(roost_home), cwd=tmp_path) as client:
        assert (await client.initialize())["status"] == "ready"
        await _watcher_live(client, config, _config(one))
        config.write_text(_config(one) + "[mcp_servers.x]\ncommand = 5\n")
        error = await client.wait_for("config/error")
        assert "[mcp_servers.x] command" in error["message"] and "expected a string" in error["message"]
        assert len(client.notifications("config/changed")) == 1
        assert (await client.request("initialize", {}))["status"] == "needs_setup"


async def test_a_broken_config_at_start_is_needs_setup_and_recovers(tmp_path: Path, roost_home: Path,
                                                                    scripts) -> None:
    one, _ = scripts
    config = roost_home / "config.toml"
    config.write_text("[provider\n")  # not TOML
    async with open_app_server(env=_env(roost_home), cwd=tmp_path) as client:
        init = await client.initialize()
        assert init["status"] == "needs_setup" and "is not valid TOML" in init["issues"][0]
        error = await client.wait_for("config/error")
        assert error == {"path": str(config), "message": init["issues"][0]}
        thread = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]
        await expect_error(client, "turn/start", {"thread_id": thread["id"], "prompt": "hi"}, "invalid_params")
        config.write_text(_config(one))
        changed = await client.wait_for("config/changed")
        assert changed["status"] == "ready" and changed["model"]["script"] == str(one)
        assert (await client.request("initialize", {}))["status"] == "ready"
        assert (await client.run_turn(thread["id"], "hello"))["turn"]["status"] == "completed"
        assert len(client.notifications("config/error")) == 1


#: documents that load as TOML but are rejected: a wrong type, an unknown provider, a missing script
REJECTED_VALUES = [
    ('[provider]\nname = 5\n', "[provider] name"),
    ('[provider]\nname = "nope"\n', "unknown provider 'nope'"),
    ('[provider]\nname = "scripted"\n[provider.headers]\nX-Team = 5\n', "[provider.headers]"),
    ('[provider]\nname = "scripted"\nheaders = 3\n', "[provider.headers]"),
    ('[provider]\nname = "scripted"\nimages = "yes"\n', "[provider] images"),
    ('[provider]\nname = "scripted"\nmodel = 3\n', "[provider] model"),
    ('[provider]\nname = "scripted"\nscript = "/nonexistent/script.yaml"\n', "/nonexistent/script.yaml"),
]


@pytest.mark.parametrize(("text", "what"), REJECTED_VALUES)
async def test_every_rejected_config_at_start_sends_config_error(tmp_path: Path, roost_home: Path,
                                                                 text: str, what: str) -> None:
    """app-server-protocol.md, "Transport and initialization": a configuration that cannot be
    loaded is config/error, at start as on reload (it was needs_setup alone for these)."""
    config = roost_home / "config.toml"
    config.write_text(text)
    async with open_app_server(env=_env(roost_home), cwd=tmp_path) as client:
        init = await client.initialize()
        assert init["status"] == "needs_setup" and what in init["issues"][0], init["issues"]
        error = await client.wait_for("config/error")
        assert error == {"path": str(config), "message": init["issues"][0]}


async def test_no_config_file_is_needs_setup_without_config_error(tmp_path: Path, roost_home: Path) -> None:
    async with open_app_server(env=_env(roost_home), cwd=tmp_path) as client:
        init = await client.initialize()
        assert init["status"] == "needs_setup"
        await client.request("thread/list", {})
        assert client.notifications("config/error") == []   # nothing to load: nothing failed to load


@pytest.mark.parametrize("command", [["exec", "hi"], ["run", "-c", "x.yaml", "t"], ["serve"], ["repl"]])
def test_other_commands_refuse_a_broken_config_in_one_line(tmp_path: Path, roost_home: Path,
                                                           command: list[str]) -> None:
    (roost_home / "config.toml").write_text('[provider]\nname = "scripted"\nmodle = "x"\n')
    done = subprocess.run([*roost_argv(), *command], check=False, env=_env(roost_home), cwd=tmp_path,
                          input=b"", capture_output=True, timeout=scaled(60))
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert err.startswith(f"roost {command[0]}: error: [provider] in ") and "'modle'" in err
    assert err.count("\n") == 1 and "Usage:" not in err and "Traceback" not in err
