"""Provider selection: flags > environment > config.toml; the CLI options and `roost models`."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from roost.cli._engine_options import EngineFlags, engine_options
from roost.cli._models import models_command
from roost.config import SETUP_HINT, load_config, resolve_provider
from roost.errors import ConfigError


def write_config(home, text: str):
    path = home / "config.toml"
    path.write_text(text)
    return path


def test_nothing_configured_names_the_settings(roost_home):
    with pytest.raises(ConfigError) as info:
        resolve_provider(env={"ROOST_HOME": str(roost_home)})
    message = str(info.value)
    for name in ("--provider", "ROOST_PROVIDER", "config.toml", "ROOST_MODEL", "ROOST_BASE_URL", "ROOST_SCRIPT", "OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        assert name in message
    assert message == SETUP_HINT


def test_scripted_only_by_explicit_default(roost_home):
    settings = resolve_provider(env={"ROOST_HOME": str(roost_home)}, allow_scripted_default=True)
    assert (settings.provider, settings.script, settings.source) == ("scripted", "demo", "default")


def test_precedence_flag_env_file(roost_home):
    path = write_config(roost_home, '[provider]\nname = "anthropic"\nmodel = "file-model"\nbase_url = "http://file"\nmax_attempts = 2\n[provider.headers]\nX-A = "1"\n')
    env = {"ANTHROPIC_API_KEY": "ak", "OPENAI_API_KEY": "ok"}
    s = resolve_provider(env=env, config_path=path)
    assert (s.provider, s.model, s.base_url, s.api_key, s.max_attempts, s.headers, s.source) == (
        "anthropic", "file-model", "http://file", "ak", 2, {"X-A": "1"}, "file")
    env |= {"ROOST_PROVIDER": "openai", "ROOST_MODEL": "env-model"}
    s = resolve_provider(env=env, config_path=path)
    assert (s.provider, s.model, s.base_url, s.api_key, s.source) == ("openai", "env-model", "http://file", "ok", "env")
    s = resolve_provider(provider="openai-responses", model="flag-model", base_url="http://flag", env=env, config_path=path)
    assert (s.provider, s.model, s.base_url, s.source) == ("openai-responses", "flag-model", "http://flag", "flag")
    assert "ok" not in repr(s) and s.describe()["api_key_set"] is True


def test_api_key_env_and_missing_keys(roost_home):
    env = {"ROOST_HOME": str(roost_home), "MY_KEY": "secret"}
    s = resolve_provider(provider="openai", api_key_env="MY_KEY", env=env)
    assert s.api_key == "secret" and s.base_url == "https://api.openai.com/v1"
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        resolve_provider(provider="openai", env=env)
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        resolve_provider(provider="anthropic", base_url="http://local", env=env)
    # A local OpenAI-compatible server (Ollama, vLLM, ...) needs no key.
    s = resolve_provider(provider="openai", base_url="http://localhost:11434/v1", env=env)
    assert s.api_key is None


def test_bad_values(roost_home):
    env = {"ROOST_HOME": str(roost_home)}
    with pytest.raises(ConfigError, match="unknown provider 'gemini'.*ROOST_PROVIDER"):
        resolve_provider(env=env | {"ROOST_PROVIDER": "gemini"})
    path = write_config(roost_home, "[provider\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        resolve_provider(env=env, config_path=path)
    # a provider chosen by the environment does not make a broken file "ignored": it is the error
    with pytest.raises(ConfigError, match="not valid TOML"):
        resolve_provider(env=env | {"ROOST_PROVIDER": "scripted"}, config_path=path)
    path = write_config(roost_home, '[provider]\nname = "scripted"\nmax_attempts = "x"\n')
    with pytest.raises(ConfigError, match="max_attempts"):
        resolve_provider(env=env, config_path=path)
    assert load_config(roost_home / "absent.toml") == {}


def test_config_file_from_roost_home(roost_home):
    write_config(roost_home, '[provider]\nname = "scripted"\nscript = "my.yaml"\n')
    s = resolve_provider(env={"ROOST_HOME": str(roost_home)})
    assert (s.provider, s.script, s.source) == ("scripted", "my.yaml", "file")


def test_engine_options_decorator(roost_home):
    seen = {}

    @click.command()
    @engine_options
    @click.option("--other", default="x")
    def cmd(engine_flags: EngineFlags, other: str) -> None:
        seen["flags"] = engine_flags
        seen["settings"] = engine_flags.resolve(env={"ROOST_HOME": str(roost_home)})

    result = CliRunner().invoke(cmd, ["--provider", "scripted", "--script", "demo", "--model", "m", "--other", "y"])
    assert result.exit_code == 0, result.output
    assert seen["flags"] == EngineFlags(provider="scripted", script="demo", model="m")
    assert seen["settings"].provider == "scripted"
    result = CliRunner().invoke(cmd, ["--provider", "bogus"])
    assert result.exit_code == 2


def test_models_command_json(roost_home, monkeypatch):
    runner = CliRunner()
    result = runner.invoke(models_command, ["--json", "--provider", "scripted"])
    assert result.exit_code == 0
    assert json.loads(result.stdout) == {"protocolVersion": 1, "items": [{"id": "demo", "current": True}]}
    result = runner.invoke(models_command, ["--json"])
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc["protocolVersion"] == 1 and "ROOST_PROVIDER" in doc["error"]
    result = runner.invoke(models_command, ["--provider", "scripted"])
    assert result.exit_code == 0 and result.stdout == "* demo\n"


def test_every_documented_key_is_accepted(roost_home):
    path = write_config(roost_home, '[provider]\nname = "openai"\nbase_url = "http://x/v1"\nmodel = "m"\n'
                        'script = "s"\napi_key_env = "K"\nconnect_timeout = 1\nread_timeout = 2\nmax_attempts = 3\n'
                        'images = false\n[provider.headers]\nX-A = "1"\n[mcp_servers.n]\ncommand = "python3"\n')
    assert set(load_config(path)) == {"provider", "mcp_servers"}


@pytest.mark.parametrize(("text", "expected"), [
    ('[provider]\nmodle = "x"\n', "[provider] in {path}: unknown key 'modle' (known keys: name, base_url"),
    ("bogus_top = 1\n", "{path}: unknown top-level key 'bogus_top' (known tables: [provider], [mcp_servers])"),
    ("[bogus_table]\n", "{path}: unknown table [bogus_table] (known tables: [provider], [mcp_servers])"),
    ('[mcp_servers.x]\ncommand = "a"\nconect_timeout = 1\n', "[mcp_servers.x] in config.toml: unknown key"),
])
def test_unknown_keys_are_refused_naming_the_key_and_the_known_ones(roost_home, text, expected):
    path = write_config(roost_home, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(expected.format(path=path))
    with pytest.raises(ConfigError):  # a flag choosing the provider does not skip the file
        resolve_provider(provider="scripted", config_path=path, env={})


def test_unknown_keys_are_refused_in_a_json_config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"provider": {"name": "scripted", "modle": "x"}}))
    with pytest.raises(ConfigError, match="unknown key 'modle'"):
        load_config(path)


@pytest.mark.parametrize(
    "line",
    [
        "max_attempts = -3",
        "max_attempts = 2.5",
        "max_attempts = 0",
        "max_attempts = true",
        "connect_timeout = true",
        "connect_timeout = 0",
        "read_timeout = -1",
        "read_timeout = inf",
        "connect_timeout = nan",
        'connect_timeout = "abc"',
    ],
)
def test_provider_numbers_must_be_positive_naming_the_key_and_the_path(roost_home, line):
    path = write_config(roost_home, f'[provider]\nname = "scripted"\n{line}\n')
    key = line.split(" ")[0]
    with pytest.raises(ConfigError) as info:
        resolve_provider(env={"ROOST_HOME": str(roost_home)}, config_path=path)
    message = str(info.value)
    assert key in message and str(path) in message and "positive" in message and "\n" not in message


def test_name_and_provider_must_agree(roost_home):
    env = {"ROOST_HOME": str(roost_home)}
    path = write_config(roost_home, '[provider]\nname = "anthropic"\nprovider = "scripted"\n')
    with pytest.raises(ConfigError, match="name = 'anthropic' and provider = 'scripted'"):
        resolve_provider(env=env, config_path=path)
    write_config(roost_home, '[provider]\nname = "anthropic"\nprovider = "anthropic"\nread_timeout = 1.5\n')
    settings = resolve_provider(env=env | {"ANTHROPIC_API_KEY": "k"}, config_path=path)
    assert (settings.provider, settings.read_timeout) == ("anthropic", 1.5)


@pytest.mark.parametrize(("value", "shown"), [("5", "the integer 5"), ("true", "the boolean true"),
                                              ("[1]", "an array"), ("1.5", "the number 1.5")])
def test_a_provider_name_of_the_wrong_type_says_it_must_be_a_string(roost_home, value, shown):
    """`[provider] name = 5` said "unknown provider 5", `name = true` "unknown provider True"."""
    from click.testing import CliRunner

    from roost.cli._main import main

    write_config(roost_home, f"[provider]\nname = {value}\n")
    env = {"ROOST_HOME": str(roost_home), "ROOST_PROVIDER": ""}
    result = CliRunner().invoke(main, ["exec", "hi"], env=env)
    assert result.exit_code == 2
    assert f"[provider] name in {roost_home / 'config.toml'} must be a string" in result.stderr
    assert f"(got {shown})" in result.stderr and "True" not in result.stderr


@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_flag_or_the_environment_wins_over_a_broken_name(roost_home, how):
    """README: flags, then environment, then config.toml; a broken file `name` does not stop
    `roost exec --provider scripted` (the rest of the file is still checked)."""
    from click.testing import CliRunner

    from roost.cli._main import main

    write_config(roost_home, '[provider]\nname = 5\nmodel = "m"\n')
    env = {"ROOST_HOME": str(roost_home), "ROOST_PROVIDER": "scripted" if how == "env" else ""}
    args = ["exec", *(["--provider", "scripted"] if how == "flag" else []), "--ephemeral", "plain echo"]
    result = CliRunner().invoke(main, args, env=env)
    assert result.exit_code == 0, result.stderr
    write_config(roost_home, "[provider]\nname = 5\nmodel = 7\n")
    result = CliRunner().invoke(main, args, env=env)
    assert result.exit_code == 2 and "[provider] model" in result.stderr and "(got the integer 7)" in result.stderr


def test_the_known_keys_name_provider_as_the_spelling_of_name(roost_home):
    path = write_config(roost_home, "[provider]\nmodle = 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "known keys: name, base_url" in str(info.value)
    assert "headers, provider" not in str(info.value) and "provider is another spelling of name" in str(info.value)
