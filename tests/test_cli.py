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


def test_an_unknown_gpu_policy_is_refused_at_start_naming_the_choices(capsys):
    assert cli_main(["--gpu-scheduler-policy", "binpak"]) == 2
    assert capsys.readouterr().err == (
        'hami-scheduler: --gpu-scheduler-policy: unknown GPU policy "binpak" (choose from binpack, spread, '
        "fragmentation-aware, mutex, numa, topology-aware, or a comma list of them such as numa,binpack)\n")
    assert cli_main(["--gpu-scheduler-policy", " numa , tightest,x,x"]) == 2
    assert 'unknown GPU policies "tightest", "x" in "numa,tightest,x,x" (choose from' in capsys.readouterr().err


def test_an_unknown_node_policy_is_refused_at_start_naming_the_choices(capsys):
    assert cli_main(["--node-scheduler-policy", "numa"]) == 2
    assert capsys.readouterr().err == ('hami-scheduler: --node-scheduler-policy: unknown node policy "numa" '
                                       "(choose from binpack, spread, fragmentation-aware)\n")


def test_help_names_the_commands_first_and_still_lists_every_flag(capsys):
    """``hami-scheduler --help`` said nothing of simulate, defrag or version."""
    from hami_py.cli import COMMANDS, build_parser
    from hami_py.defrag.cli import build_parser as defrag_parser
    from hami_py.simulate.cli import build_parser as simulate_parser
    with pytest.raises(SystemExit) as exit_:
        cli_main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    top = out.split("\noptions:\n")[0].splitlines()
    assert top[:2] == ["usage: hami-scheduler [flags]", "       hami-scheduler {simulate,defrag,version} [args]"]
    assert list(COMMANDS) == ["simulate", "defrag", "version"]
    for name, text in COMMANDS.items():
        assert f"  {name:<8}  {text}" in top, name
    # Each one-line description is the start of the command's own --help description.
    assert simulate_parser().description.lower().startswith(COMMANDS["simulate"])
    assert defrag_parser().description.lower().startswith(COMMANDS["defrag"])
    flags = [s for a in build_parser()._actions for s in a.option_strings]
    assert "--http_bind" in flags and "--gpu-scheduler-policy" in flags and "-v" in flags
    assert all(f in out for f in flags)


def test_no_flag_is_abbreviated_in_any_command(capsys):
    """Abbreviations off in the scheduler's, simulate's and defrag's parsers: a shortened flag is
    refused, naming it, rather than taken for the one it starts (or, later, for another)."""
    from hami_py.cli import build_parser
    from hami_py.defrag.cli import build_parser as defrag_parser
    from hami_py.simulate.cli import build_parser as simulate_parser
    assert [p().allow_abbrev for p in (build_parser, simulate_parser, defrag_parser)] == [False] * 3
    for argv, unknown in ((["--http_b", "127.0.0.1:1"], "--http_b"), (["--leader-elect-resource-n=x"],
                          "--leader-elect-resource-n=x"), (["simulate", "--compare"], "--compare"),
                          (["defrag", "--free", "1", "--clus", "x"], "--clus")):
        assert cli_main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.endswith(f": unrecognized arguments: {unknown}\n") and err.count("\n") == 1, err
    # The spellings upstream's chart passes, and klog's -v, still parse (tests/test_chart_args.py has them all).
    ns = build_parser().parse_args(["--leader-elect=true", "--leader-elect-resource-name=x", "-v=4", "--debug"])
    assert (ns.leader_elect, ns.leader_elect_resource_name, ns.verbosity, ns.debug) == (True, "x", 4, True)


def test_the_readme_cluster_command_parses_and_its_device_config_loads():
    """The README's "Running it against a cluster" command named a device-config.yaml that did not
    exist; it must name a file that is there and that the scheduler accepts."""
    import shlex
    from pathlib import Path

    from hami_py.cli import build_parser
    from hami_py.config import ConfigError, load_device_config
    import hami_py.devices.registry  # noqa: F401 - the families declare their config sections

    repo = Path(__file__).resolve().parent.parent
    readme = (repo / "README.md").read_text()
    section = readme.split("## Running it against a cluster\n", 1)[1]
    command = section.split("```sh\n", 1)[1].split("```", 1)[0]
    argv = shlex.split(command.replace("\\\n", " "))
    assert argv[0] == ".venv/bin/hami-scheduler"
    ns = build_parser().parse_args(argv[1:])
    assert ns.device_config_file and not Path(ns.device_config_file).is_absolute()
    assert load_device_config(repo / ns.device_config_file).sections["nvidia"]
    with pytest.raises(ConfigError, match="is a Kubernetes ConfigMap"):   # the ConfigMap is not the file
        load_device_config(repo / "manifests" / "device-config.yaml")


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
