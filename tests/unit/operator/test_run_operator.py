"""The ``vramguard operator`` command's flags."""

from __future__ import annotations

import pytest

from vramguard_operator.cli.main import build_parser
from vramguard_operator.cli.run_operator import config_from_args


def test_chart_arguments_parse_and_defaults_hold(monkeypatch):
    for var in ("VRAMGUARD_EVALUATION_PERIOD", "VRAMGUARD_FRESHNESS"):
        monkeypatch.delenv(var, raising=False)
    args = build_parser().parse_args(
        ["operator", "--standalone", "--all-namespaces", "--liveness=http://0.0.0.0:8080/healthz",
         "--metrics-port=9090", "--webhook-port=9443", "--webhook-tls-dir=/tls"]
    )
    cfg = config_from_args(args)
    assert args.namespace == [] and args.metrics_port == 9090
    assert (cfg.evaluation_period, cfg.freshness, cfg.debounce) == (5.0, 60.0, 0.02)
    assert (cfg.default_rate_limit.per_minute, cfg.default_rate_limit.burst) == (2, 2)


def test_test_settings_come_from_flags_or_environment(monkeypatch):
    monkeypatch.setenv("VRAMGUARD_FRESHNESS", "15s")
    args = build_parser().parse_args(
        ["operator", "-n", "t-*", "-n", "ml", "--evaluation-period", "1s", "--eviction-retry", "2s"]
    )
    cfg = config_from_args(args)
    assert args.namespace == ["t-*", "ml"]
    assert (cfg.evaluation_period, cfg.eviction_retry, cfg.freshness) == (1.0, 2.0, 15.0)


def test_bad_values_name_the_flag(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["operator", "--freshness", "a while"])
    assert "--freshness" in capsys.readouterr().err
    args = build_parser().parse_args(["operator", "--eviction-burst", "0"])
    with pytest.raises(ValueError, match="--eviction-burst"):
        config_from_args(args)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["operator", "-A", "-n", "ml"])


@pytest.mark.parametrize(("var", "value", "flag"), [
    ("VRAMGUARD_METRICS_PORT", "http", "--metrics-port"),
    ("VRAMGUARD_METRICS_PORT", "70000", "--metrics-port"),
    ("VRAMGUARD_EVICTION_RATE_PER_MINUTE", "2.5", "--eviction-rate-per-minute"),
    ("VRAMGUARD_EVICTION_BURST", "lots", "--eviction-burst"),
])
def test_bad_environment_values_name_the_variable_not_a_traceback(monkeypatch, capsys, var, value, flag):
    monkeypatch.setenv(var, value)
    parser = build_parser()  # building the parser does not convert environment values
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["operator"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and var in err and repr(value) in err


def test_a_flag_overrides_a_bad_environment_value(monkeypatch):
    monkeypatch.setenv("VRAMGUARD_METRICS_PORT", "http")
    assert build_parser().parse_args(["operator", "--metrics-port", "9091"]).metrics_port == 9091
