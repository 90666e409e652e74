"""docs/cli.md covers the command line as argparse defines it: every command, every flag."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from precision_nb.cli.main import SUBCOMMANDS, build_parser

CLI_MD = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    """The long flags a user can give (not --help, not ones hidden from --help)."""
    return {
        option
        for action in parser._actions
        if action.help is not argparse.SUPPRESS and not isinstance(action, argparse._HelpAction)
        for option in action.option_strings
        if option.startswith("--")
    }


def _section(command: str) -> str:
    text = CLI_MD.read_text(encoding="utf-8")
    # the heading names the command, with its positional arguments where it has some
    start = re.search(rf"^## `precision-nb {command}[` ]", text, flags=re.MULTILINE).start()
    after = re.search(r"^## ", text[start + 3 :], flags=re.MULTILINE)
    return text[start : start + 3 + after.start()] if after else text[start:]


def _table_flags(section: str) -> set[str]:
    return set(re.findall(r"^\| `(--[\w-]+)", section, flags=re.MULTILINE))


def test_the_intro_names_every_command_and_counts_them_right() -> None:
    intro = CLI_MD.read_text(encoding="utf-8").split("## ", 1)[0]
    assert set(_subparsers()) == set(SUBCOMMANDS)
    words = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}
    assert f"has {words[len(SUBCOMMANDS)]} commands" in intro
    for command in SUBCOMMANDS:
        assert f"- `{command}`:" in intro


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_flag_has_a_row_in_its_commands_table_and_no_row_is_stale(command) -> None:
    flags = _flags(_subparsers()[command])
    documented = _table_flags(_section(command))
    assert flags - documented == set(), f"flags of `{command}` missing from docs/cli.md"
    assert documented - flags == set(), f"docs/cli.md lists flags `{command}` does not have"


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_row_shows_the_parsers_default(command) -> None:
    """A default is shown as argparse has it (`value`, or off); a None default is described."""
    rows = {
        row.split("|")[1].strip().strip("`").split()[0]: row.split("|")[2].strip()
        for row in _section(command).splitlines()
        if row.startswith("| `--")
    }
    for action in _subparsers()[command]._actions:
        flag = next((o for o in action.option_strings if o.startswith("--")), None)
        if flag not in rows or flag == "--help":
            continue
        shown = rows[flag]
        if action.default is False:
            assert shown == "off", flag
        elif action.default is None:
            assert shown and "None" not in shown, flag  # what happens without the flag
        else:
            assert shown == f"`{action.default}`", flag


def test_the_check_can_fail() -> None:
    assert "--no-such-flag" not in _table_flags(_section("profile"))
    assert _flags(_subparsers()["plan"]) >= {"--as", "--simulate", "--json"}


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_help_has_no_doubled_percent_and_lists_every_flag(command, capsys) -> None:
    parser = _subparsers()[command]
    text = parser.format_help()
    assert "%%" not in text and "%(" not in text
    for flag in _flags(parser):
        assert flag in text
