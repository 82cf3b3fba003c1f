"""The ``vramguard operator`` command's flags and variables: one table
(``controller.settings.parameters``) read into ``OperatorSettings``, by the
command and by ``kopf run`` (``settings_from_env``) alike."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import click
import pytest

from vramguard_operator.cli.main import main
from vramguard_operator.controller.settings import (
    DEFAULT_LIVENESS,
    OperatorSettings,
    WebhookConfig,
    parameters,
    parse_settings,
    settings_from_env,
)

CHART_ARGS = ["--standalone", "--all-namespaces", "--liveness=http://0.0.0.0:8080/healthz",
              "--metrics-port=9090", "--webhook-port=9443", "--webhook-tls-dir=/tls"]


def get(settings: Any, path: str) -> Any:
    """``settings.a.b`` for path ``"a.b"``."""
    for part in path.split("."):
        settings = getattr(settings, part)
    return settings


def test_chart_arguments_parse_and_defaults_hold():
    settings = parse_settings(CHART_ARGS, env={})
    cfg = settings.config
    assert settings.namespaces == () and settings.metrics_port == 9090
    assert (cfg.evaluation_period, cfg.freshness, cfg.debounce) == (5.0, 60.0, 0.02)
    assert (cfg.default_rate_limit.per_minute, cfg.default_rate_limit.burst) == (2, 2)
    assert settings.webhook == WebhookConfig(9443, "/tls")


def test_test_settings_come_from_flags_or_environment(monkeypatch):
    monkeypatch.setenv("VRAMGUARD_FRESHNESS", "15s")
    settings = parse_settings(["-n", "t-*", "-n", "ml", "--evaluation-period", "1s", "--eviction-retry", "2s"])
    cfg = settings.config
    assert settings.namespaces == ("t-*", "ml")
    assert (cfg.evaluation_period, cfg.eviction_retry, cfg.freshness) == (1.0, 2.0, 15.0)


def test_bad_values_name_the_flag(capsys):
    assert main(["operator", "--freshness", "a while"]) == 2
    assert "--freshness" in capsys.readouterr().err
    with pytest.raises(click.BadParameter) as err:
        parse_settings(["--eviction-burst", "0"], env={})
    assert "--eviction-burst" in err.value.format_message()
    with pytest.raises(click.UsageError):
        parse_settings(["-A", "-n", "ml"], env={})


@pytest.mark.parametrize(("var", "value", "flag"), [
    ("VRAMGUARD_METRICS_PORT", "http", "--metrics-port"),
    ("VRAMGUARD_METRICS_PORT", "70000", "--metrics-port"),
    ("VRAMGUARD_EVICTION_RATE_PER_MINUTE", "2.5", "--eviction-rate-per-minute"),
    ("VRAMGUARD_EVICTION_BURST", "lots", "--eviction-burst"),
])
def test_bad_environment_values_name_the_variable_not_a_traceback(monkeypatch, capsys, var, value, flag):
    monkeypatch.setenv(var, value)
    assert main(["operator"]) == 2
    out, err = capsys.readouterr()
    assert flag in err and var in err and repr(value) in err
    assert out == ""  # errors go to stderr


def test_a_flag_overrides_a_bad_environment_value(monkeypatch):
    monkeypatch.setenv("VRAMGUARD_METRICS_PORT", "http")
    assert parse_settings(["--metrics-port", "9091"]).metrics_port == 9091


# --- every setting: flag > variable > default ---------------------------------------------

_KEYS = tempfile.mkdtemp(prefix="vramguard-keys-")
KEY_A, KEY_B = os.path.join(_KEYS, "a"), os.path.join(_KEYS, "b")
for _path, _key in ((KEY_A, "a" * 32), (KEY_B, "b" * 24 + "\n")):
    with open(_path, "w") as _f:
        _f.write(_key)

# (flag, variable, value for the variable, value for the flag, settings path,
#  read from the variable, read from the flag, default)
ENV_SETTINGS = [
    ("--liveness", "VRAMGUARD_LIVENESS", "", "http://127.0.0.1:1/healthz", "liveness",
     "", "http://127.0.0.1:1/healthz", DEFAULT_LIVENESS),
    ("--metrics-port", "VRAMGUARD_METRICS_PORT", "0", "9091", "metrics_port", 0, 9091, 9090),
    ("--metrics-address", "VRAMGUARD_METRICS_ADDRESS", "127.0.0.1", "::1", "metrics_address",
     "127.0.0.1", "::1", "0.0.0.0"),
    ("--evaluation-period", "VRAMGUARD_EVALUATION_PERIOD", "1s", "2m", "config.evaluation_period", 1.0, 120.0, 5.0),
    ("--debounce", "VRAMGUARD_DEBOUNCE", "50ms", "1s", "config.debounce", 0.05, 1.0, 0.02),
    ("--freshness", "VRAMGUARD_FRESHNESS", "2m", "15s", "config.freshness", 120.0, 15.0, 60.0),
    ("--eviction-retry", "VRAMGUARD_EVICTION_RETRY", "1m", "2s", "config.eviction_retry", 60.0, 2.0, 30.0),
    ("--request-timeout", "VRAMGUARD_REQUEST_TIMEOUT", "3s", "1500ms", "config.request_timeout", 3.0, 1.5, 10.0),
    ("--watch-timeout", "VRAMGUARD_WATCH_TIMEOUT", "1m", "10m", "watch_timeout", 60.0, 600.0, 300.0),
    ("--evaluation-timeout", "VRAMGUARD_EVALUATION_TIMEOUT", "5s", "1m", "config.evaluation_timeout", 5.0, 60.0,
     30.0),
    ("--state-key-file", "VRAMGUARD_STATE_KEY_FILE", KEY_A, KEY_B, "config.state_key_file", KEY_A, KEY_B, ""),
    ("--eviction-rate-per-minute", "VRAMGUARD_EVICTION_RATE_PER_MINUTE", "0", "12",
     "config.default_rate_limit.per_minute", 0, 12, 2),
    ("--eviction-burst", "VRAMGUARD_EVICTION_BURST", "5", "1", "config.default_rate_limit.burst", 5, 1, 2),
    ("--dra-uuid-attribute", "VRAMGUARD_DRA_UUID_ATTRIBUTE", "gpuUUID", "amd.com/uuid", "config.dra.uuid_attribute",
     "gpuUUID", "amd.com/uuid", "uuid"),
    ("--dra-memory-capacity", "VRAMGUARD_DRA_MEMORY_CAPACITY", "vram", "hbm", "config.dra.memory_capacity",
     "vram", "hbm", "memory"),
    ("--webhook-port", "VRAMGUARD_WEBHOOK_PORT", "8443", "9443", "webhook.port", 8443, 9443, None),
    ("--webhook-tls-dir", "VRAMGUARD_WEBHOOK_TLS_DIR", "/env-tls", "/flag-tls", "webhook.tls_dir",
     "/env-tls", "/flag-tls", "/tmp/vramguard-webhook-tls"),
    ("--webhook-address", "VRAMGUARD_WEBHOOK_ADDRESS", "10.0.0.5", "::", "webhook.addr", "10.0.0.5", "::", "0.0.0.0"),
    ("--webhook-host", "VRAMGUARD_WEBHOOK_HOST", "svc.ns", "10.1.1.1", "webhook.host", "svc.ns", "10.1.1.1",
     "127.0.0.1"),
    ("--webhook-managed", "VRAMGUARD_WEBHOOK_MANAGED", "true", "false", "webhook.managed", True, False, False),
    ("--webhook-extra-sans", "VRAMGUARD_WEBHOOK_EXTRA_SANS", "a.svc,b.svc", "c.svc", "webhook.extra_sans",
     ("a.svc", "b.svc"), ("c.svc",), ()),
    ("--namespaces", "VRAMGUARD_NAMESPACES", "ml, t-*", "research", "namespaces", ("ml", "t-*"), ("research",), ()),
    ("--status-refresh", "VRAMGUARD_STATUS_REFRESH", "1m", "45s", "config.status_refresh", 60.0, 45.0, 30.0),
    ("--unlabelled-pods", "VRAMGUARD_UNLABELLED_PODS", "ignore", "watch", "config.unlabelled_pods", False, True, True),
    ("--shards", "VRAMGUARD_SHARDS", "3", "2", "shards", 3, 2, 1),
    ("--shard-identity", "VRAMGUARD_SHARD_IDENTITY", "op-1", "op-2", "shard_identity", "op-1", "op-2", ""),
    ("--lease-namespace", "VRAMGUARD_LEASE_NAMESPACE", "vg", "vg-2", "lease_namespace", "vg", "vg-2", ""),
    ("--lease-duration", "VRAMGUARD_LEASE_DURATION", "1m", "20s", "lease_duration", 60.0, 20.0, 30.0),
    ("--log-format", "VRAMGUARD_LOG_FORMAT", "json", "text", "log_format", "json", "text", "text"),
]
# flags without a variable: (arguments, settings path, value)
FLAG_SETTINGS = [
    (["-n", "ml", "--namespace", "t-*"], "namespaces", ("ml", "t-*")),
    (["-A"], "namespaces", ()),
    (["--standalone"], "namespaces", ()),  # accepted, changes nothing
    (["-v"], "verbose", True),
    (["--debug"], "debug", True),
    (["-q"], "quiet", True),
]


def _base(path: str, flag: str) -> dict[str, str]:
    # the other webhook settings are read only when a port is set
    return {"VRAMGUARD_WEBHOOK_PORT": "7443"} if path.startswith("webhook.") and flag != "--webhook-port" else {}


@pytest.mark.parametrize(("flag", "var", "env_value", "flag_value", "path", "from_env", "from_flag", "default"),
                         ENV_SETTINGS, ids=[row[0] for row in ENV_SETTINGS])
def test_every_setting_reads_its_flag_over_its_variable_over_its_default(
    flag, var, env_value, flag_value, path, from_env, from_flag, default
):
    base = _base(path, flag)
    if path.startswith("webhook.") and default is None:
        assert parse_settings([], env=base).webhook is None  # no port: no webhooks
    else:
        assert get(parse_settings([], env=base), path) == default
    assert get(parse_settings([], env={**base, var: env_value}), path) == from_env
    assert get(parse_settings([flag, flag_value], env={**base, var: env_value}), path) == from_flag
    assert get(parse_settings([f"{flag}={flag_value}"], env=base), path) == from_flag


@pytest.mark.parametrize(("argv", "path", "value"), FLAG_SETTINGS, ids=[" ".join(r[0]) for r in FLAG_SETTINGS])
def test_flags_without_a_variable_reach_the_settings(argv, path, value):
    assert get(parse_settings(argv, env={}), path) == value


def test_the_tables_cover_every_parameter():
    """A new flag must be added to the tables above (and so tested)."""
    named = {row[0] for row in ENV_SETTINGS} | {a for row in FLAG_SETTINGS for a in row[0] if a.startswith("-")}
    for param in parameters():
        assert set(param.opts) & named, f"{param.opts} is not tested"
    variables = {p.envvar for p in parameters() if p.envvar}
    assert variables == {row[1] for row in ENV_SETTINGS}


def test_defaults_are_the_documented_ones():
    assert parse_settings([], env={}) == OperatorSettings()


def test_the_namespaces_flag_wins_over_the_variable():
    assert parse_settings(["-n", "a"], env={"VRAMGUARD_NAMESPACES": "b"}).namespaces == ("a",)
    assert parse_settings(["-A"], env={"VRAMGUARD_NAMESPACES": "b"}).namespaces == ()


# (flag, variable, bad value)
BAD_VALUES = [
    ("--metrics-port", "VRAMGUARD_METRICS_PORT", "-1"),
    ("--eviction-rate-per-minute", "VRAMGUARD_EVICTION_RATE_PER_MINUTE", "-1"),
    ("--eviction-burst", "VRAMGUARD_EVICTION_BURST", "0"),
    ("--webhook-port", "VRAMGUARD_WEBHOOK_PORT", "https"),
    ("--webhook-port", "VRAMGUARD_WEBHOOK_PORT", "70000"),
    *((flag, var, "a while") for flag, var, *_ in ENV_SETTINGS if flag in (
        "--evaluation-period", "--debounce", "--freshness", "--eviction-retry", "--request-timeout",
        "--watch-timeout", "--evaluation-timeout")),
    ("--state-key-file", "VRAMGUARD_STATE_KEY_FILE", "/nonexistent/state-key"),
    ("--freshness", "VRAMGUARD_FRESHNESS", "-5s"),
    ("--shards", "VRAMGUARD_SHARDS", "0"),
    ("--unlabelled-pods", "VRAMGUARD_UNLABELLED_PODS", "sometimes"),
    ("--status-refresh", "VRAMGUARD_STATUS_REFRESH", "a while"),
]


@pytest.mark.parametrize(("flag", "var", "bad"), BAD_VALUES, ids=[f"{r[0]}={r[2]}" for r in BAD_VALUES])
def test_a_bad_value_names_flag_variable_and_value(flag, var, bad):
    for argv, env in (([flag, bad], {}), ([], {var: bad})):
        with pytest.raises(click.BadParameter) as err:
            parse_settings(argv, env=env)
        text = err.value.format_message()
        assert flag in text and var in text and repr(bad) in text, text


def test_kopf_run_reads_the_same_table_from_the_environment():
    env = {"VRAMGUARD_FRESHNESS": "2m", "VRAMGUARD_METRICS_PORT": "0", "VRAMGUARD_WEBHOOK_PORT": "9443"}
    assert settings_from_env(env) == parse_settings([], env=env)
    with pytest.raises(ValueError, match=r"--freshness.*VRAMGUARD_FRESHNESS.*'soon'"):
        settings_from_env({"VRAMGUARD_FRESHNESS": "soon"})


def test_the_process_environment_is_read_when_none_is_given(monkeypatch):
    monkeypatch.setenv("VRAMGUARD_EVICTION_BURST", "4")
    assert parse_settings([]).config.default_rate_limit.burst == 4
    assert settings_from_env().config.default_rate_limit.burst == 4


def test_an_empty_webhook_port_variable_means_no_webhooks():
    assert parse_settings([], env={"VRAMGUARD_WEBHOOK_PORT": ""}).webhook is None


@pytest.mark.parametrize("argv", [["-v", "-q"], ["-d", "--verbose"], ["-A", "-n", "ml"]])
def test_flags_that_exclude_each_other_are_refused(argv):
    with pytest.raises(click.UsageError, match="cannot be used together"):
        parse_settings(argv, env={})


def test_the_state_key_is_read_from_its_file_and_reaches_the_engine():
    settings = parse_settings(["--state-key-file", KEY_B], env={})
    assert settings.config.state_key == b"b" * 24  # white space stripped
    assert settings.config.engine().state_key == b"b" * 24
    assert "bbbb" not in repr(settings)  # never in a log line
    assert parse_settings([], env={}).config.engine().state_key is None


def test_a_short_state_key_is_refused(tmp_path):
    short = tmp_path / "short"
    short.write_text("0123456789\n")
    with pytest.raises(click.BadParameter, match=r"has 10 bytes; want at least 16"):
        parse_settings(["--state-key-file", str(short)], env={})
