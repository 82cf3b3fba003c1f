"""Every input error a user can make, through the real commands (subprocesses, as a
shell runs them): one line on stderr naming the file, field or flag, the value and
what is wanted (with a hint where one is likely), the documented exit code
(docs/cli.md), and never a traceback. The cases of issue 28 and the ones behind
them: empty, header-only, binary, unknown-format, huge and negative input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BUDGET = ROOT / "examples" / "replay" / "budget.yaml"
USAGE = ROOT / "examples" / "replay" / "usage.csv"
LOG = ROOT / "tests" / "fixtures" / "leak-corpus" / "eval-spikes-1.csv"
VRAMGUARD = [sys.executable, "-m", "vramguard_operator"]
AGENT = [sys.executable, "-m", "vramguard_agent"]
BINARY = bytes(range(256)) * 4

BUDGET_TEXT = """apiVersion: vramguard.io/v1alpha1
kind: GPUMemoryBudget
metadata: {name: b, namespace: ns}
spec:
  selector: {matchLabels: {app: x}}
  limits:
    perPod: {vram: VRAM}
  enforcement:
    escalation: [{action: Annotate, after: AFTER}]
"""


def budget(vram: str = "20Gi", after: str = "1m", typo: bool = False) -> str:
    text = BUDGET_TEXT.replace("VRAM", vram).replace("AFTER", after)
    return text.replace("limits:", "limts:") if typo else text


# (id, command, {file name: content}, exit code, text the one line must hold)
CASES = [
    ("analyze-plot-unknown-format", [*VRAMGUARD, "analyze", str(LOG), "--plot", "{tmp}/out.txt"], {}, 2,
     "name the file .png, .svg or .pdf"),
    ("analyze-missing-file", [*VRAMGUARD, "analyze", "{tmp}/absent.csv"], {}, 2, "absent.csv"),
    ("analyze-empty", [*VRAMGUARD, "analyze", "{tmp}/log.csv"], {"log.csv": ""}, 2, "log.csv: no samples"),
    ("analyze-header-only", [*VRAMGUARD, "analyze", "{tmp}/log.csv"], {"log.csv": "t_seconds,bytes\n"}, 2,
     "log.csv: no samples"),
    ("analyze-binary", [*VRAMGUARD, "analyze", "{tmp}/log.csv"], {"log.csv": BINARY}, 2, "cannot read"),
    ("analyze-unknown-format", [*VRAMGUARD, "analyze", "{tmp}/log.csv"], {"log.csv": '{"a": 1}\n'}, 2, "line 1"),
    ("analyze-huge-value", [*VRAMGUARD, "analyze", "{tmp}/log.csv"], {"log.csv": "t_seconds,bytes\n0,1e38\n1,2\n"},
     2, "line 2: bytes '1e38' is above the maximum of 8Pi"),
    ("analyze-negative-value", [*VRAMGUARD, "analyze", "{tmp}/log.csv"], {"log.csv": "t_seconds,bytes\n0,-5\n"}, 2,
     "must not be negative"),
    ("analyze-bare-limit", [*VRAMGUARD, "analyze", str(LOG), "--limit", "80"], {}, 2,
     "--limit: 80 has no unit (80 bytes); write 80Gi or 80G"),
    ("analyze-limit-GB", [*VRAMGUARD, "analyze", str(LOG), "--limit", "80GB"], {}, 2,
     "write 80G (10^9 bytes) or 80Gi (2^30 bytes)"),
    ("analyze-unknown-flag", [*VRAMGUARD, "analyze", str(LOG), "--limt", "80Gi"], {}, 2,
     "unrecognized arguments: --limt"),
    ("replay-infinite-bytes", [*VRAMGUARD, "replay", "--budget", str(BUDGET), "--usage", "{tmp}/u.csv"],
     {"u.csv": "t_seconds,pod,vram_bytes\n0,p,1e400\n"}, 2, "u.csv:2: vram_bytes: '1e400' is above the maximum"),
    ("replay-negative-trend-window", [*VRAMGUARD, "replay", "--budget", str(BUDGET), "--usage", str(USAGE),
                                      "--trend-window", "-5"], {}, 2, "--trend-window: invalid duration '-5'"),
    ("replay-header-only", [*VRAMGUARD, "replay", "--budget", str(BUDGET), "--usage", "{tmp}/u.csv"],
     {"u.csv": "t_seconds,pod,vram_bytes\n"}, 2, "u.csv: no samples"),
    ("replay-empty-usage", [*VRAMGUARD, "replay", "--budget", str(BUDGET), "--usage", "{tmp}/u.csv"],
     {"u.csv": ""}, 2, "u.csv: no samples"),
    ("replay-step-log-without-interval", [*VRAMGUARD, "replay", "--budget", str(BUDGET), "--usage", "{tmp}/u.csv"],
     {"u.csv": "step,bytes\n0,5\n"}, 2, "u.csv: line 1: a log indexed by step (or without a time column) needs"),
    ("replay-binary-usage", [*VRAMGUARD, "replay", "--budget", str(BUDGET), "--usage", "{tmp}/u.csv"],
     {"u.csv": BINARY}, 2, "u.csv: not a UTF-8 text file"),
    ("replay-binary-budget", [*VRAMGUARD, "replay", "--budget", "{tmp}/b.yaml", "--usage", str(USAGE)],
     {"b.yaml": BINARY}, 2, "b.yaml: not a UTF-8 text file"),
    ("replay-negative-time", [*VRAMGUARD, "replay", "--budget", str(BUDGET), "--usage", "{tmp}/u.csv"],
     {"u.csv": "t_seconds,pod,vram_bytes\n-1,p,5\n"}, 2, "u.csv:2: t_seconds: '-1' is not in [0,"),
    ("replay-unknown-step", [*VRAMGUARD, "replay", "--budget", str(BUDGET), "--usage", str(USAGE),
                             "--fail-on", "Evicted"], {}, 2, "--fail-on: invalid choice: 'Evicted'"),
    ("budget-GB", [*VRAMGUARD, "replay", "--budget", "{tmp}/b.yaml", "--usage", str(USAGE)],
     {"b.yaml": budget(vram="20GB")}, 2, "spec.limits.perPod.vram: '20GB': want a Kubernetes quantity"),
    ("budget-space", [*VRAMGUARD, "replay", "--budget", "{tmp}/b.yaml", "--usage", str(USAGE)],
     {"b.yaml": budget(vram="20 Gi")}, 2, "write 20Gi (no space)"),
    ("budget-negative", [*VRAMGUARD, "replay", "--budget", "{tmp}/b.yaml", "--usage", str(USAGE)],
     {"b.yaml": budget(vram="-20Gi")}, 2, "must not be negative"),
    ("budget-after-number", [*VRAMGUARD, "replay", "--budget", "{tmp}/b.yaml", "--usage", str(USAGE)],
     {"b.yaml": budget(after="5")}, 2, "escalation[0].after: 5 is a number, not a string: want a Go duration"),
    ("budget-typo", [*VRAMGUARD, "replay", "--budget", "{tmp}/b.yaml", "--usage", str(USAGE)],
     {"b.yaml": budget(typo=True)}, 2, "spec.limts: unknown field; did you mean limits?"),
    ("budget-not-yaml", [*VRAMGUARD, "replay", "--budget", "{tmp}/b.yaml", "--usage", str(USAGE)],
     {"b.yaml": "a: [1,\n"}, 2, "b.yaml: invalid YAML"),
    ("simulate-too-many-nodes", [*VRAMGUARD, "simulate", "--nodes", "99999999999"], {}, 2,
     "above the maximum of 10000"),
    ("simulate-negative-duration", [*VRAMGUARD, "simulate", "--duration", "-1h"], {}, 2, "--duration"),
    ("simulate-huge-seed", [*VRAMGUARD, "simulate", "--seed", "99999999999"], {}, 2, "want a whole number from 0"),
    ("top-dead-api-server", [*VRAMGUARD, "top", "-A", "--kubeconfig", "{tmp}/kc"],
     {"kc": "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
            "contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n"
            "users: [{name: u, user: {token: x}}]\n"}, 1,
     "cannot read the cluster at https://127.0.0.1:1: "),
    ("top-bad-selector", [*VRAMGUARD, "top", "-l", "app>1"], {}, 2,
     "Invalid value for '-l' / '--selector': cannot parse 'app>1'"),
    ("top-bad-sort-by", [*VRAMGUARD, "top", "--sort-by", "vrm"], {}, 2,
     "unknown column 'vrm' (did you mean vram?); want one or more of namespace, pod, node, vram"),
    ("vramguard-unknown-command", [*VRAMGUARD, "analyse"], {}, 2, "No such command 'analyse'"),
    ("operator-without-kubeconfig", [*VRAMGUARD, "operator"], {}, 1, "no Kubernetes credentials"),
    ("operator-bad-duration", [*VRAMGUARD, "operator", "--evaluation-period", "5"], {}, 2,
     "--evaluation-period"),
    ("agent-missing-scenario", [*AGENT, "once", "--backend", "sim", "--scenario", "{tmp}/missing.yaml"], {}, 2,
     "--scenario {tmp}/missing.yaml: cannot read it: No such file or directory"),
    ("agent-missing-proc-root", [*AGENT, "once", "--node", "n", "--proc-root", "/nonexistent"], {}, 2,
     "--proc-root /nonexistent: no such directory"),
    ("agent-bad-scenario", [*AGENT, "once", "--backend", "sim", "--scenario", "{tmp}/s.yaml", "--node", "n"],
     {"s.yaml": "nodes:\n- name: n\n  gpus: [{model: x, memory: 20GB}]\n"}, 2,
     "scenario {tmp}/s.yaml: nodes[0].gpus[0].memory: '20GB'"),
    ("agent-binary-scenario", [*AGENT, "once", "--backend", "sim", "--scenario", "{tmp}/s.yaml", "--node", "n"],
     {"s.yaml": BINARY}, 2, "scenario {tmp}/s.yaml: not YAML"),
    ("agent-unknown-node", [*AGENT, "once", "--backend", "sim", "--scenario", str(ROOT / "examples/scenarios/demo.yaml"),
                            "--node", "nope"], {}, 2, "scenario has no node 'nope'"),
    ("agent-unknown-command", [*AGENT, "onse"], {}, 2, "No such command 'onse'"),
]


@pytest.mark.parametrize(("argv", "files", "code", "says"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_an_input_error_is_one_line_with_its_exit_code_and_no_traceback(tmp_path, argv, files, code, says):
    for name, content in files.items():
        (tmp_path / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.pathsep.join(str(ROOT / d) for d in
                                                                             ("api", "operator", "agent")),
           "HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "no-kubeconfig")}
    done = subprocess.run([a.replace("{tmp}", str(tmp_path)) for a in argv], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert "Traceback" not in done.stderr
    assert len(lines) == 1, done.stderr
    assert done.returncode == code, done.stderr
    assert says.replace("{tmp}", str(tmp_path)) in lines[0]


@pytest.mark.parametrize("argv", [[*VRAMGUARD], [*VRAMGUARD, "top"], [*VRAMGUARD, "operator"],
                                  [*VRAMGUARD, "analyze"], [*VRAMGUARD, "replay"], [*VRAMGUARD, "simulate"],
                                  [*AGENT], [*AGENT, "run"], [*AGENT, "once"]], ids=" ".join)
def test_every_command_takes_h_and_the_tops_take_version(argv):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(ROOT / d) for d in ("api", "operator", "agent"))}
    helped = subprocess.run([*argv, "-h"], capture_output=True, text=True, env=env, timeout=60)
    assert helped.returncode == 0 and "usage" in helped.stdout.lower(), helped.stderr
    if len(argv) == 3:  # the command groups
        version = subprocess.run([*argv, "--version"], capture_output=True, text=True, env=env, timeout=60)
        assert version.returncode == 0 and version.stdout.split()[-1] == "0.1.0"
