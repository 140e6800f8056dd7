"""The `jitape` command line: each subcommand in-process, and `python -m jitape` once."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import jitape as jt
from jitape import cli, demo
from jitape_kernels import cpu

SCALAR = "jitape.Tensor({}, shape=(), dtype=float32)"


def test_info_lists_versions_floatx_cache_and_backends(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    for key in ("jitape", "python", "numpy", "numba", "scipy", "floatx", "numba cache",
                "backend cpu", "backend cuda"):
        assert f"\n{key} " in "\n" + out
    assert "float32" in out


def test_demo_prints_the_seeds_results_with_timings(capsys):
    assert cli.main(["demo"]) == 0
    out = capsys.readouterr().out
    for value in ("36.0", "10.0", "6.0", "2.0", "108.0", "3.0"):
        assert SCALAR.format(value) in out
    assert "[[8. 8.]" in out
    assert "GradientTape.gradient can only be called once on non-persistent tapes." in out
    assert out.count(f"{SCALAR.format('3.0')}\nNone\n") == 2
    assert "Epoch 0, Loss: 0.0" in out and "Epoch 90, Loss: 0.0" in out
    assert "Final w: 2.0, b: 1.0" in out
    for example in demo.EXAMPLES:
        assert f"== {demo.title(example)}\n" in out
    assert out.count(" ms)\n") == len(demo.EXAMPLES)
    assert out.rstrip().splitlines()[-1].startswith(f"{len(demo.EXAMPLES)} examples in ")


def test_warmup_compiles_in_worker_processes_every_kernel_a_first_run_calls(capsys):
    assert cli.main(["warmup", "--jobs", "2"]) == 0
    captured = capsys.readouterr()
    steps = len(cpu.warmup_steps())
    assert f"compiled and cached {steps} kernels" in captured.out and " on 2 cores " in captured.out
    assert "[" + "#" * 30 + f"] {steps}/{steps}" in captured.err
    for name, _ in cpu.warmup_steps():
        assert f"compiled {name}\n" in captured.err
    # a signature the warmup compiles but no caller passes (plan's rows were writable, a tape's are read-only
    # views of its bytes) leaves the first gradient after it to compile for seconds
    # in the jitape this process imported (a checkout on sys.path or the installed package: its kernels' files
    # name their cache entries)
    environment = dict(os.environ, PYTHONPATH=str(Path(jt.__file__).parents[1]))
    first_uses = subprocess.run([sys.executable, str(Path(__file__).with_name("first_uses.py"))], env=environment,
                                capture_output=True, text=True, check=True).stdout.splitlines()
    assert first_uses[0] == f"jitape: {jt.__file__}"
    assert [line for line in first_uses if line.startswith(("missed:", "not warmed:"))] == []


def _children(pid):
    """The processes whose parent is `pid` and that have not ended (Linux's /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:         # ended meanwhile
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def _ended(pids):
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":        # an ended process nobody reaped yet counts as ended
            return False
    return True


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT], ids=["killed", "interrupted"])
def test_a_killed_warmup_s_workers_end_with_it(tmp_path, how):
    """Killed (or interrupted) while its workers compile, a warmup takes them with it: orphaned, they compiled on
    for minutes."""
    environment = dict(os.environ, JITAPE_CACHE_DIR=str(tmp_path))      # a cold cache: minutes of compiles
    warmup = subprocess.Popen([sys.executable, "-m", "jitape", "warmup", "--jobs", "2"], env=environment,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while len(workers := _children(warmup.pid)) < 3 and time.monotonic() < deadline:   # two and a tracker
            time.sleep(0.2)
        assert len(workers) >= 3, f"the warmup started {workers}"
        time.sleep(2)       # their imports done, compiling
    finally:
        warmup.send_signal(how)
        warmup.wait(30)
    deadline = time.monotonic() + 30
    while not _ended(workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _ended(workers)


def test_warmup_on_one_core_compiles_in_its_own_process(capsys, monkeypatch):
    def no_pool(*args, **kwargs):
        raise AssertionError("a one-core warmup started worker processes")
    monkeypatch.setattr(cli, "_worker_pool", no_pool)
    assert cli.main(["warmup", "-j", "1"]) == 0
    assert " on 1 core " in capsys.readouterr().out


def test_warmup_refuses_a_number_of_jobs_below_one(capsys):
    with pytest.raises(SystemExit):
        cli.main(["warmup", "--jobs", "0"])
    assert "expected a number of processes >= 1, got 0" in capsys.readouterr().err


def test_bench_without_the_perf_suite_says_how_to_get_it(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(cli, "_PERF_RUNNER", tmp_path / "missing" / "run.py")
    assert cli.main(["bench"]) == 0
    assert "source checkout" in capsys.readouterr().out


def test_bench_runs_the_perf_suite_with_its_arguments(monkeypatch, tmp_path):
    (tmp_path / "pyproject.toml").touch()
    runner = tmp_path / "perf" / "run.py"
    runner.parent.mkdir()
    runner.write_text("import sys\nsys.exit(len(sys.argv[1:]))\n")
    monkeypatch.setattr(cli, "_PERF_RUNNER", runner)
    assert cli.main(["bench", "--quick", "w1"]) == 2


def test_unknown_or_missing_command_is_a_usage_error(capsys):
    for argv in ([], ["frobnicate"]):
        with pytest.raises(SystemExit) as exit_:
            cli.main(argv)
        assert exit_.value.code == 2
    assert "usage: jitape" in capsys.readouterr().err


def test_python_dash_m_jitape():
    result = subprocess.run([sys.executable, "-m", "jitape", "info"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "numba cache" in result.stdout
