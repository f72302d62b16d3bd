"""tests/forkserver.py: a command run forked from the server behaves as the process it
replaces (arguments, working directory, environment, streams, exit status, atexit)."""

import os
import subprocess
import sys

from tests import forkserver

SCRIPT = """import atexit, os, sys
atexit.register(lambda: print("atexit ran", flush=True))
print("argv", sys.argv[1:], "cwd", os.getcwd(), "X", os.environ.get("X"))
print("from stdin:", sys.stdin.read().strip(), file=sys.stderr)
if sys.argv[1] == "fail":
    raise ValueError("the script's own error")
sys.exit(int(sys.argv[1]))
"""


def test_a_forked_script_sees_its_command_and_exits_as_a_process_would(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT, encoding="utf-8")
    outcomes = []
    for argument in ("0", "3", "fail"):
        command, env = forkserver.routed([sys.executable, str(script), argument],
                                         dict(os.environ, X="y"))
        assert command[0] != sys.executable
        done = subprocess.run(command, env=env, cwd=tmp_path, input="hello",
                              capture_output=True, text=True, timeout=120)
        outcomes.append((done.returncode, done.stdout, done.stderr))
    for (code, out, err), want in zip(outcomes, (0, 3, 1)):
        assert code == want, err
        assert out.startswith("argv [") and f"cwd {tmp_path} X y" in out, out
        assert out.rstrip().endswith("atexit ran") and "from stdin: hello" in err, (out, err)
    assert "ValueError: the script's own error" in outcomes[2][2]
    assert "Traceback" not in outcomes[1][2]


def test_a_shell_python_runs_modules_forked_and_the_rest_with_the_real_interpreter(tmp_path):
    """Forked: the server is the parent, not the shell; `python -c` is the shell's child."""
    (tmp_path / "parent.py").write_text(
        "import os, sys\nprint(os.getppid() == int(sys.argv[1]))\n", encoding="utf-8")
    done = subprocess.run(
        ["bash", "-c", "python -m parent $$ && python -c 'import parent' $$ "
                       "&& python parent.py $$; true"],
        env=forkserver.shell_env(dict(os.environ)), cwd=tmp_path, capture_output=True,
        text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "False"], done.stdout
