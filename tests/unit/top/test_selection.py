"""``vramguard top``'s ``-l``, ``--sort-by`` and ``--color``: the selector syntax,
the column orders, when colours are used, and the flags' one-line errors."""

from __future__ import annotations

import click
import pytest

from tests.unit.top.test_rows import GI, NOW, budget, pod, report, usage
from vramguard_operator.cli.top.command import TopSettings, parse_settings, tables, use_color
from vramguard_operator.cli.top.model import Limit, Row, Snapshot
from vramguard_operator.cli.top.render import render
from vramguard_operator.cli.top.selection import parse_label_selector, parse_sort_by, pod_matcher, sort_rows

# (selector, labels, matches): apimachinery labels.Parse semantics
MATCHES = [
    ("", {}, True),
    ("app=train", {"app": "train"}, True),
    ("app=train", {"app": "serve"}, False),
    ("app==train", {"app": "train"}, True),
    ("app!=train", {"app": "serve"}, True),
    ("app!=train", {}, True),  # != matches a pod without the key, as in Kubernetes
    ("app!=train", {"app": "train"}, False),
    ("app", {"app": ""}, True),
    ("app", {"team": "a"}, False),
    ("!app", {"team": "a"}, True),
    ("!app", {"app": "x"}, False),
    ("team in (a, b)", {"team": "b"}, True),
    ("team in (a,b)", {"team": "c"}, False),
    ("team notin (a,b)", {}, True),
    ("team notin (a,b)", {"team": "a"}, False),
    ("app=train,team in (a,b)", {"app": "train", "team": "a"}, True),
    ("app=train,team in (a,b)", {"app": "train", "team": "c"}, False),
    ("example.com/tier = gold , !spot", {"example.com/tier": "gold"}, True),
    ("app=", {"app": ""}, True),
]


@pytest.mark.parametrize(("text", "labels", "matches"), MATCHES)
def test_label_selector_matches_as_kubectl(text, labels, matches):
    assert pod_matcher(text)(labels) is matches


def test_no_selector_matches_every_pod():
    assert pod_matcher(None)({"any": "thing"})


# (selector, text the one-line error holds)
BAD_SELECTORS = [
    ("app>1", "cannot parse 'app>1'"),
    ("app=a b", "cannot parse 'app=a b'"),
    ("app in a,b", "cannot parse 'app in a'"),
    ("a=b,,c", "cannot parse ''"),
    ("app=x=y", "cannot parse 'app=x=y'"),
    ("-bad-key=x", "-bad-key"),
    ("app=" + "v" * 64, "app="),
]


@pytest.mark.parametrize(("text", "wanted"), BAD_SELECTORS)
def test_a_bad_selector_is_one_line_naming_the_flag_and_the_requirement(text, wanted):
    with pytest.raises(ValueError) as err:
        parse_label_selector(text)
    message = str(err.value)
    assert message.startswith("--selector: ") and wanted in message and "\n" not in message


def row(name: str, ns: str = "ml", vram: int | None = None, pressure: float | None = None, state: str = "ok",
        growth: float | None = None, node: str | None = "n1") -> Row:
    limits = (Limit("pod", 10 * GI, vram, "gmb/b"),) if vram is not None else ()
    return Row(ns, name, node, vram, (), None, limits, growth, None, state, (), pressure, False)


ROWS = [
    row("a", ns="zz", vram=1 * GI, pressure=0.1),
    row("b", ns="ml", vram=None, pressure=None, state="violating"),
    row("c", ns="ml", vram=9 * GI, pressure=0.9, growth=2.0 * GI),
    row("d", ns="aa", vram=5 * GI, pressure=0.5, state="warning", node=None, growth=-1.0 * GI),
]

# (--sort-by, pods in order): numbers largest first, text ascending, unknown last, ties by state then use
ORDERS = [
    ((), ["b", "d", "c", "a"]),
    (("vram",), ["c", "d", "a", "b"]),
    (("-vram",), ["a", "d", "c", "b"]),
    (("use",), ["c", "d", "a", "b"]),
    (("namespace",), ["d", "b", "c", "a"]),
    (("-namespace",), ["a", "b", "c", "d"]),
    (("namespace", "vram"), ["d", "c", "b", "a"]),
    (("node",), ["b", "c", "a", "d"]),
    (("trend",), ["c", "d", "b", "a"]),
    (("state",), ["b", "d", "c", "a"]),
    (("pod",), ["a", "b", "c", "d"]),
]


@pytest.mark.parametrize(("by", "order"), ORDERS)
def test_sort_by_columns(by, order):
    assert [r.pod for r in sort_rows(ROWS, by)] == order


@pytest.mark.parametrize(("text", "wanted"), [
    ("vrm", "unknown column 'vrm' (did you mean vram?); want one or more of namespace, pod, node, vram"),
    ("vram,", "unknown column ''"),
    ("memory", "unknown column 'memory'; want one or more of"),
])
def test_a_bad_sort_column_is_one_line_listing_the_valid_ones(text, wanted):
    with pytest.raises(ValueError) as err:
        parse_sort_by(text)
    assert str(err.value) == f"--sort-by: {str(err.value).removeprefix('--sort-by: ')}" and wanted in str(err.value)


def test_sort_by_is_case_blind():
    assert parse_sort_by("VRAM,-Namespace") == ("vram", "-namespace")


# (--color, stdout a terminal, environment, colours)
COLORS = [
    ("auto", True, {}, True),
    ("auto", False, {}, False),
    ("auto", True, {"NO_COLOR": "1"}, False),
    ("auto", True, {"NO_COLOR": ""}, True),  # no-color.org: set and not empty
    ("always", False, {"NO_COLOR": "1"}, True),
    ("never", True, {}, False),
]


@pytest.mark.parametrize(("choice", "tty", "env", "wanted"), COLORS)
def test_colours_only_on_a_terminal_without_no_color(choice, tty, env, wanted):
    assert use_color(choice, tty, env) is wanted


def test_coloured_states_keep_the_columns_aligned():
    plain = render(ROWS).splitlines()
    coloured = render(ROWS, color=True).splitlines()
    assert "\x1b[" not in "".join(plain)
    assert coloured[0] == plain[0]  # the header is not painted
    by_pod = {line.split()[0]: line for line in coloured[1:]}  # rows in ROWS' order: a, b, c, d
    assert "\x1b[31mviolating\x1b[0m" in by_pod["b"] and "\x1b[33mwarning\x1b[0m" in by_pod["d"]
    assert "\x1b[32mok\x1b[0m" in by_pod["a"]
    for p, c in zip(plain[1:], coloured[1:], strict=True):
        assert click.unstyle(c) == p


def test_flags_read_selector_sort_and_color():
    s = parse_settings(["-l", "app=train", "--sort-by", "namespace,vram", "--color", "never"])
    assert (s.selector, s.sort_by, s.color) == ("app=train", ("namespace", "vram"), "never")
    assert parse_settings([]).sort_by == () and parse_settings([]).color == "auto"
    for argv, wanted in [(["-l", "app>1"], "cannot parse 'app>1'"), (["--sort-by", "vrm"], "did you mean vram?"),
                         (["--color", "sometimes"], "'sometimes' is not one of")]:
        with pytest.raises(click.UsageError) as err:
            parse_settings(argv)
        assert wanted in err.value.format_message()


def test_selector_narrows_the_table_but_not_a_budgets_total():
    snap = Snapshot(pods=[pod("d", labels={"app": "tot", "role": "lead"}), pod("e", labels={"app": "tot"})],
                    budgets=[budget("tot", {"total": {"vram": "40Gi"}})],
                    reports=[report([usage("d", 4 * GI), usage("e", 6 * GI)])], now=NOW)
    rows, _, _ = tables(snap, TopSettings(selector="role=lead"))
    assert [r.pod for r in rows] == ["d"]
    total = next(lim for lim in rows[0].limits if lim.name == "total")
    assert total.used_bytes == 10 * GI  # e, not shown, still counts toward the total
    assert [r.pod for r in tables(snap, TopSettings(selector="role!=lead", sort_by=("vram",)))[0]] == ["e"]
    assert [r.pod for r in tables(snap, TopSettings(sort_by=("-vram",)))[0]] == ["d", "e"]
