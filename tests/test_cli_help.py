"""`kvsim --help` and each command's --help speak to users: what each command does for them,
examples, and help texts that stay in step with what the code accepts."""

from __future__ import annotations

import pytest

from simulator.cli.main import COMMANDS, build_parser, main


def test_top_help_lists_every_command_with_what_it_does(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for name, line in COMMANDS.items():
        assert f"  {name}" in out and line in out
    assert "register(" not in out and "subcommand" not in out
    assert "common invocations:" in out and "kvsim run my.yaml --set" in out
    assert "usage: kvsim [-h] [--version] COMMAND ..." in out


def test_every_registered_command_is_in_the_table():
    assert sorted(build_parser().commands) == sorted(COMMANDS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_command_help_describes_it(name):
    text = build_parser().commands[name].format_help()
    assert text.startswith(f"usage: kvsim {name} ")
    body = text.split("\n\n", 2)[1]  # the description paragraph
    assert len(body.split()) >= 8, body
    assert "register(" not in text


def test_run_help_shows_every_option():
    text = build_parser().commands["run"].format_help()
    for flag in ("--set", "--seeds", "--out", "--trace-steps", "--block-size", "--max-num-seqs",
                 "--tensor-parallel-size", "--gpu-memory-utilization"):
        assert flag in text
    assert "examples:" in text


def test_usage_error_is_one_line_naming_the_command(capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", "--seeds", "many"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == ["kvsim run: error: argument --seeds: invalid int value: 'many'; "
                                "see `kvsim run --help`"]


def test_unknown_command_suggests_the_close_one(capsys):
    with pytest.raises(SystemExit) as e:
        main(["rnu"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unknown command 'rnu' (did you mean 'run'?)" in err


def test_unknown_option_is_named_by_its_command(capsys):
    with pytest.raises(SystemExit):
        main(["sweep", "--grdi", "engine.block_size=8"])
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == ["kvsim sweep: error: unrecognized arguments: --grdi; "
                                "see `kvsim sweep --help`"]


def test_help_texts_name_what_the_code_accepts():
    """The command modules hold a few names for --help only (they import no analysis code)."""
    from simulator.analysis.parity import CASES
    from simulator.analysis.plan import SLO_FIELDS
    from simulator.calibration.profile import DEFAULT_TOKENS
    from simulator.cli import plan

    parser = build_parser()
    parity_help = parser.commands["parity"].format_help()
    assert all(case in parity_help for case in CASES)
    assert plan.SLO_KEYS == SLO_FIELDS
    profile_help = " ".join(parser.commands["profile"].format_help().split())
    assert f"default {DEFAULT_TOKENS[0]},{DEFAULT_TOKENS[1]}," in profile_help
    assert f",{DEFAULT_TOKENS[-1]})" in profile_help
