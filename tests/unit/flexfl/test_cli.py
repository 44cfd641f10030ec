"""The `flexfl` parser as a whole: every choice list is its owner's, and the help says what the code does."""

from __future__ import annotations

import argparse
import enum
import typing
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from coordinator.config import CoordinatorConfig
from coordinator.rules.config import RulesConfig
from coordinator.rules.strategies import Staleness, strategy_names
from flexfl.app.cli import build_parser
from flexfl.app.live import LiveConfig, load_live_config
from flexfl.config import FLAG_PREFIX
from flexfl.vocabulary import Scheme, Unit
from loadgen.protocol import COMMANDS
from simulator.engine import SimConfig
from simulator.paper_numbers import SWEEP_DATASETS
from workloads.partition_spec import Dataset, PartitionSpec


@dataclass(frozen=True)
class _PartitionOnly:  # `flexfl data show` reads only a [partition] table
    partition: PartitionSpec


# The config class behind each command's flag_dest() flags.
ROOTS = {("coordinator",): CoordinatorConfig, ("live",): LiveConfig, ("sim", "run"): SimConfig,
         ("sim", "schemes"): SimConfig, ("data", "show"): _PartitionOnly}
# Config fields that hold a name from a registry (not an enum), and the registry's names.
REGISTRY_FIELDS = {"strategy": strategy_names()}
# Choice lists of flags that set no config field, and their owners.
OWNERS = {
    (("sim", "run"), "--strategy"): [*Scheme, *strategy_names(asynchronous=True)],
    (("sim", "run"), "--staleness"): list(Staleness),
    (("sim", "table3"), "--dataset"): SWEEP_DATASETS,
    (("sim", "table3"), "--unit"): list(Unit),
    (("sim", "table4"), "--unit"): list(Unit),
    (("sim", "table5"), "--unit"): list(Unit),
    (("sim", "arrivals-figure"), "--unit"): list(Unit),
    (("sim", "arrivals-figure"), "--dataset"): SWEEP_DATASETS,
    (("sim", "operating-point"), "--dataset"): SWEEP_DATASETS,
    (("sim", "strategies"), "--dataset"): SWEEP_DATASETS,
    (("sim", "strategies"), "--unit"): list(Unit),
    (("sim", "operating-point"), "--unit"): list(Unit),
    (("loadgen", "send"), "--cmd"): list(COMMANDS),
}


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...],
                                                                                             argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


def _field_type(root: type, dest: str) -> typing.Any:
    tp: typing.Any = root
    for name in dest.removeprefix(FLAG_PREFIX).split("."):
        tp = typing.get_type_hints(tp)[name]
        if typing.get_origin(tp) is typing.Union or isinstance(tp, type(int | None)):
            tp = next(a for a in typing.get_args(tp) if a is not type(None))
    return tp


def _values(items) -> list[str]:
    return [str(v.value if isinstance(v, enum.Enum) else v) for v in items]


def test_every_choice_list_is_its_owners() -> None:
    """--sizes offered 2 of the 6 readings, and --departure-policy once left out auto: lists copied by hand drift."""
    checked = 0
    for path, parser in _commands(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction) or not action.option_strings:
                continue
            flag = action.option_strings[-1]
            if action.dest.startswith(FLAG_PREFIX):
                tp = _field_type(ROOTS[path], action.dest)
                if isinstance(tp, type) and issubclass(tp, enum.Enum):
                    assert action.choices is not None, (path, flag, "an enum field needs its choices")
                    assert _values(action.choices) == _values(tp), (path, flag)
                    checked += 1
                elif action.dest.rpartition(".")[2] in REGISTRY_FIELDS:
                    assert _values(action.choices) == _values(REGISTRY_FIELDS[action.dest.rpartition(".")[2]])
                    checked += 1
                else:
                    assert action.choices is None, (path, flag, tp)
            elif action.choices is not None:
                assert (path, flag) in OWNERS, f"{' '.join(path)} {flag}: add the owner of its choices to OWNERS"
                assert _values(action.choices) == _values(OWNERS[path, flag]), (path, flag)
                checked += 1
    assert checked >= 25, checked


def _help(*command: str) -> str:
    parser = build_parser()
    for name in command:
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
    return " ".join(parser.format_help().split())  # argparse wraps lines


def test_a_command_that_runs_several_schemes_has_one_flag_for_them() -> None:
    """`sim run` had --scheme (ignored) and --schemes; `sim schemes` always compares all three."""
    parser = build_parser()
    run = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["sim"]
    subs = next(a for a in run._actions if isinstance(a, argparse._SubParsersAction)).choices
    shown = {cmd: {f for a in subs[cmd]._actions if a.help != argparse.SUPPRESS for f in a.option_strings
                   if "scheme" in f} for cmd in ("run", "schemes")}
    assert shown == {"run": {"--scheme"}, "schemes": set()}, shown
    assert ("repeatable (default: the strategy the --config file's [rules] names, else A, B and C)"
            in _help("sim", "run"))


@pytest.mark.parametrize("command", [("coordinator",), ("sim", "run"), ("live",)])
def test_eta0_help_states_each_datasets_default(command: tuple[str, ...]) -> None:
    """The help said "the paper's per dataset" where `flexfl live` trains MNIST at 0.1."""
    text = _help(*command)
    for dataset in Dataset:
        if command == ("live",):  # live has defaults of its own below the file and the flags
            eta0 = load_live_config(None, overrides={"partition": {"dataset": str(dataset)}}).rules.eta0_for(dataset)
        else:
            eta0 = RulesConfig().eta0_for(dataset)
        assert f"{dataset} {eta0:g}" in text, (command, dataset, eta0, text)


def test_help_names_values_not_internal_destinations() -> None:
    """`--listen CFG.SERVER.LISTEN`, `--token-file FLEET_TOKEN_FILE`: the help showed where a value is stored."""
    for path, parser in _commands(build_parser()):
        text = parser.format_help()
        assert "CFG." not in text, (path, [line for line in text.splitlines() if "CFG." in line][:3])
        for action in parser._actions:
            if action.option_strings and action.nargs != 0 and not action.choices and action.metavar is None:
                # the default metavar, from the flag itself: --deadline-s DEADLINE_S
                flag = action.option_strings[-1]
                assert f"{flag} {flag.lstrip('-').upper().replace('-', '_')}" \
                    in text or action.help == argparse.SUPPRESS, (path, action.option_strings)


@pytest.mark.parametrize("command", ["coordinator", "agent", "token"])
def test_the_commands_a_newcomer_types_first_describe_themselves(command: str) -> None:
    parser = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    assert parser.description and len(parser.description) > 40, (command, parser.description)


def test_the_parser_takes_its_choices_without_importing_torch() -> None:
    """The owners of the choices are light modules: the loadgen daemon on a Pi builds this parser too."""
    import subprocess
    import sys

    code = "import sys; from flexfl.app.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_logging_and_error_lines_belong_to_the_one_cli() -> None:
    """Only flexfl.app.cli.main configures logging (and so prints errors): a second main() drifts from it
    (loadgen/fleet_cli.py's printed its own error prefix and knew no Ctrl-C)."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    packages = ("coordinator", "edge_agent", "flexfl", "loadgen", "simulator", "trace_recorder", "workloads")
    found = sorted(str(p.relative_to(repo)) for package in packages for p in (repo / package).rglob("*.py")
                   if "logging.basicConfig(" in p.read_text(encoding="utf-8"))
    assert found == ["flexfl/app/cli.py"]


def test_flexfl_fleet_is_a_subcommand_with_the_clis_error_line(capsys) -> None:
    from flexfl.app.cli import main
    from flexfl.errors import ERROR_PREFIX

    assert main(["fleet", "up", "--devices", "2", "--cpu", "a quarter"]) == 2
    assert capsys.readouterr().err == f"{ERROR_PREFIX}--cpu: expected a number or a comma list, got 'a quarter'\n"


def _command_names(parser: argparse.ArgumentParser) -> set[str]:
    return set(next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices)


def test_each_command_is_registered_by_the_module_the_table_names() -> None:
    """main() builds the parser with only the module of the command it runs: the table must say who registers what."""
    from flexfl.app.cli import COMMAND_MODULES

    assert _command_names(build_parser()) == set(COMMAND_MODULES)
    for command in COMMAND_MODULES:
        assert command in _command_names(build_parser(command)), command
    assert _command_names(build_parser("agent")) == {"agent"}


def test_the_agent_command_imports_no_other_commands_module() -> None:
    """An edge device runs `flexfl agent`: the simulator's, coordinator's, recorder's and loadgen's CLIs stay out."""
    import subprocess
    import sys

    code = ("import sys; from flexfl.app.cli import build_parser; build_parser('agent'); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('simulator', 'coordinator', 'trace_recorder', 'loadgen') or m.startswith('flexfl.app.report')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_mistyped_flag_is_refused_by_its_command_with_its_usage_and_the_closest_flag(capsys):
    from flexfl.app.cli import main

    with pytest.raises(SystemExit) as end:
        main(["sim", "run", "--devics", "3"])
    assert end.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: flexfl sim run ")  # before: `flexfl`'s usage, which names none of its flags
    assert err.strip().endswith("flexfl sim run: error: unrecognized arguments: --devics 3 "
                                "(--devics: did you mean --devices?)"), err
    with pytest.raises(SystemExit):
        main(["coordinator", "--token-fil", "t"])  # nothing close: no guess
    assert capsys.readouterr().err.strip().endswith("flexfl coordinator: error: unrecognized arguments: --token-fil t")


def test_a_prefix_of_a_flag_is_not_taken_for_the_flag(capsys):
    """`sim table3 --seed 0` ran the whole 384-run sweep as --seeds 0 while abbreviations were allowed (issue 33)."""
    from flexfl.app.cli import main

    with pytest.raises(SystemExit) as end:
        main(["sim", "table3", "--seed", "0"])
    assert end.value.code == 2
    assert "unrecognized arguments: --seed 0 (--seed: did you mean --seeds?)" in capsys.readouterr().err
