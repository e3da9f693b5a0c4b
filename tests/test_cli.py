"""The command line: upstream's flag syntax, and a clear refusal (exit 2, one line) of values that
would otherwise turn a safety off quietly."""
from __future__ import annotations

import asyncio
import socket

import pytest

from hami_py.cli import _duration, main as cli_main
from hami_py.embedded import embedded_options, running_scheduler, wait_for


@pytest.mark.parametrize("text, seconds", [
    ("5m", 300.0), ("28s", 28.0), ("1h30m", 5400.0), ("500ms", 0.5), ("1.5s", 1.5), ("2m0.5s", 120.5),
    ("30", 30.0), ("0", 0.0), ("250us", 250e-6), ("7µs", 7e-6),
])
def test_go_durations_and_plain_seconds_are_read(text, seconds):
    assert _duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["nan", "inf", "-5m", "-1", "1e400", "1.2.3s", "5x", "", "m", "5m3"])
def test_a_bad_duration_is_refused_at_start(text, capsys):
    """``--node-lock-timeout nan`` once parsed, and made every node lock look expired."""
    assert cli_main([f"--node-lock-timeout={text}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hami-scheduler: ") and "invalid duration" in err and err.count("\n") == 1, err


def test_the_filtering_succeed_flags_default_to_one_event_a_bound_pod_and_reach_the_options():
    from hami_py.cli import build_parser, options_from_args
    default = options_from_args(build_parser().parse_args([]))
    assert (default.filtering_succeed_events, default.filtering_succeed_window_s) == ("unbound", 10.0)
    upstream = options_from_args(build_parser().parse_args(["--filtering-succeed-events=always",
                                                            "--filtering-succeed-window", "2m30s"]))
    assert (upstream.filtering_succeed_events, upstream.filtering_succeed_window_s) == ("always", 150.0)


@pytest.mark.parametrize("flag", ["--filtering-succeed-events=sometimes", "--filtering-succeed-window=-1s"])
def test_a_bad_filtering_succeed_flag_is_refused_at_start(flag, capsys):
    assert cli_main([flag]) == 2
    err = capsys.readouterr().err
    assert flag.split("=")[0] in err and err.count("\n") == 1, err


def test_an_unknown_gpu_policy_is_refused_at_start(capsys):
    assert cli_main(["--gpu-scheduler-policy", "binpak"]) == 2
    assert "--gpu-scheduler-policy 'binpak': unknown binpak" in capsys.readouterr().err


def test_an_unusable_device_config_is_refused_at_start_with_every_problem(tmp_path, capsys):
    """HAMi after v2.10 (#3010): the scheduler does not start on values no request could use, nor
    with two backends claiming one resource; one line says all of it."""
    path = tmp_path / "device-config.yaml"
    path.write_text("nvidia:\n  resourceCountName: nvidia.com/gpu\n  defaultCores: 150\n"
                    "cambricon:\n  resourceCountName: nvidia.com/gpu\n")
    assert cli_main(["--device-config-file", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == (f"hami-scheduler: {path}: invalid device configuration: nvidia: defaultCores is a percentage "
                   'and must be between 0 and 100, got 150; NVIDIA and MLU both claim resource "nvidia.com/gpu"; '
                   "a container requesting it would be allocated devices by both\n")


@pytest.mark.parametrize("text", ["1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False"])
def test_boolean_flags_take_gos_spellings(text):
    from hami_py.cli import build_parser
    assert build_parser().parse_args(["--leader-elect", text]).leader_elect is (text in ("1", "t", "T", "TRUE", "true", "True"))


async def test_a_scheduler_that_cannot_bind_its_port_leaves_nothing_running(api):
    """The watches start before the listener binds; a taken port must stop them again."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        with pytest.raises(OSError):
            async with running_scheduler(api, options=embedded_options(http_bind=f"127.0.0.1:{port}")):
                pass
        def background_left() -> list[str]:
            return [t.get_name() for t in asyncio.all_tasks()
                    if not t.done() and t.get_name().startswith(("informer", "registration keeper"))]
        await wait_for(lambda: not background_left(), what="the failed scheduler's watches stopped")
    finally:
        taken.close()
