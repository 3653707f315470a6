"""The driver's command line: flags become a validated DriverConfig; bad flags are clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.names import DRIVER_NAME
from dra_driver.__main__ import main, parse_args, partition_publishing


def test_flags_become_a_config() -> None:
    flags = "--node-name gpu-node-1 --backend simulated --profile h100x8 --cdi-dir /tmp/cdi"
    config = parse_args([*flags.split(), "--sharing-mode", "whole-device", "--http-port", "9400"])
    assert config.node_name == "gpu-node-1"
    assert config.driver_name == DRIVER_NAME
    assert (config.backend, config.profile) == ("simulated", Path("h100x8"))
    assert config.cdi_dir == Path("/tmp/cdi")
    assert config.plugin_dir == Path("/var/lib/kubelet/plugins")
    assert (config.sharing_mode, config.health_port) == ("whole-device", 9400)


@pytest.mark.parametrize(
    ("flag", "publishing"),
    [
        ([], None),  # auto: the apiserver is probed for partitionable devices
        (["--mig-mode", "dynamic"], True),  # placements published, instances made on demand
        (["--mig-mode", "static"], False),  # the MIG devices that exist, as before
    ],
)
def test_the_mig_mode_flag_chooses_how_mig_gpus_are_published(
    flag: list[str], publishing: bool | None
) -> None:
    assert partition_publishing(parse_args(["--node-name", "n", *flag])) is publishing


def test_node_name_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "from-env")
    assert parse_args([]).node_name == "from-env"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "--node-name"),
        (["--node-name", "n", "--backend", "rocm"], "invalid choice"),
        (["--node-name", "n", "--driver-name", "x" * 64], "driver_name"),
        (["--node-name", "n", "--http-port", "70000"], "health_port"),
        (["--node-name", "n", "--mig-mode", "on"], "invalid choice"),
    ],
)
def test_bad_flags_are_reported(
    argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_missing_profile_exits_with_a_clear_error(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    code = main(["--node-name", "n", "--backend", "simulated", "--profile", str(tmp_path / "none.yaml")])
    assert code == 2
    assert "cannot read GPU profile" in caplog.text


def test_relative_directories_become_absolute(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    config = parse_args(["--node-name", "n", "--plugin-dir", "plugins", "--cdi-dir", "./cdi"])
    # GetInfo's endpoint is built from the plugin directory; the kubelet cannot resolve a relative one.
    assert config.plugin_dir == tmp_path / "plugins"
    assert config.cdi_dir == tmp_path / "cdi"
