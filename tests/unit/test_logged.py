"""hack/logged.sh, how `make` keeps a step to one line: the step's output goes to its log, only
the lines matching SHOW reach the terminal, and a failure says so - with the log's tail only when
the log holds something not shown already (a step whose one line said why it stopped, such as
hack/require.sh's, is not repeated)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOGGED = ROOT / "hack" / "logged.sh"
SHOW = r"^\[(step|make)\]"  # as the Makefile's k8s-binaries step: its progress and [make] lines


def logged(log: Path, show: str, script: str) -> tuple[int, str, str]:
    result = subprocess.run(
        ["bash", str(LOGGED), str(log), show, "bash", "-c", script],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.returncode, result.stdout, result.stderr


@pytest.mark.parametrize(
    ("show", "script", "expected"),
    [
        # Succeeds: the noise stays in the log, the progress line is shown.
        (SHOW, "echo 'go: downloading x'; echo '[step] built'", (0, "[step] built\n", "")),
        # Nothing shown at all (the Python dependencies step).
        ("", "echo 'Successfully installed pip'", (0, "", "")),
        # Fails after noise: the failure, then the log's tail (its header line and the noise).
        (SHOW, "echo 'go: downloading x'; echo 'compile error' >&2; exit 2",
         (2, "", "[make] failed (exit 2): bash -c {script}\n[make] the last lines of {log}:\n# {header}\n"
          "go: downloading x\ncompile error\n")),
        # Fails with one [make] line saying why, which was shown: not said again.
        (SHOW, "echo '[make] Go >= 1.26.0 is needed' >&2; exit 1",
         (1, "[make] Go >= 1.26.0 is needed\n", "[make] failed (exit 1): bash -c {script}\n")),
        # Fails with nothing shown: everything it wrote is hidden, so the tail comes.
        ("", "echo 'ERROR: no matching distribution'; exit 1",
         (1, "", "[make] failed (exit 1): bash -c {script}\n[make] the last lines of {log}:\n# {header}\n"
          "ERROR: no matching distribution\n")),
    ],
)  # fmt: skip
def test_a_step_shows_its_lines_and_on_failure_what_was_hidden(
    tmp_path: Path, show: str, script: str, expected: tuple[int, str, str]
) -> None:
    log = tmp_path / "logs" / "step.log"
    code, out, err = logged(log, show, script)
    header = log.read_text().splitlines()[0].removeprefix("# ")  # `date -u`: the command
    assert header.endswith(f": bash -c {script}")
    status, want_out, want_err = expected
    assert (code, out, err) == (status, want_out, want_err.format(script=script, log=log, header=header))


def test_the_log_holds_everything_the_step_wrote_and_the_last_run_only(tmp_path: Path) -> None:
    log = tmp_path / "step.log"
    logged(log, SHOW, "echo first run")
    logged(log, SHOW, "echo 'go: downloading x'; echo '[step] built' >&2")
    assert log.read_text().splitlines()[1:] == ["go: downloading x", "[step] built"]
