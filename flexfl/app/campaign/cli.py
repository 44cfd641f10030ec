"""`flexfl campaign run FILE`: a campaign's live runs one after another, resumable (this package)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("campaign", help="a set of live runs (strategies x seeds x load ...) in one resumable command",
                       description="Campaigns: a base live config and the axes to vary, run one run after another "
                                   "into one folder (docs/campaigns.md).")
    commands = p.add_subparsers(dest="campaign_command", required=True, metavar="COMMAND")
    r = commands.add_parser("run", help="run every run of a campaign not ended yet (rerun to continue after an "
                                        "interruption)",
                            description="Run a campaign: every run not ended yet, in order. Interrupted (Ctrl-C, "
                                        "SIGTERM, a reboot), the same command continues: a run that ended under "
                                        "its config is never run again, an interrupted one resumes from its "
                                        "coordinator's checkpoint. Writes <out>/campaign.json, campaign.md, "
                                        "report.html and runs/<run>/ (each a flexfl live run folder).")
    r.add_argument("file", type=Path, metavar="CAMPAIGN.toml", help="the campaign file ([campaign], [base], [axes])")
    r.add_argument("--out", type=Path, default=None, help="campaign folder (default out/campaigns/<name>)")
    r.add_argument("--emulate", action="store_true",
                   help="run on the emulated fleet (root): each device in its own network namespace with its tbf "
                        "link and cgroup CPU quota, as flexfl live --emulate (default: loopback)")
    r.add_argument("--fleet", type=Path, metavar="FILE",
                   help="run on a fleet whose agents run as services on its devices (Raspberry Pis provisioned "
                        "with serve_runs) and dial this machine: each run starts only its coordinator here "
                        "(the fleet file: docs/campaigns.md)")
    r.set_defaults(func=cmd_campaign_run)


def cmd_campaign_run(args: argparse.Namespace) -> int:
    from flexfl.app.campaign.runner import CampaignRunner, LocalTarget, Target
    from flexfl.app.campaign.spec import read_campaign
    from flexfl.app.live import LiveRunError
    from flexfl.app.report import report_line
    from flexfl.errors import ConfigError
    from flexfl.signals import sigterm_as_interrupt

    campaign = read_campaign(args.file)
    out = args.out or Path("out") / "campaigns" / campaign.name
    if args.emulate and args.fleet:
        raise ConfigError("--emulate runs the devices here, --fleet on devices elsewhere: pick one")
    if args.emulate:
        from loadgen.fleet import require_root

        require_root("flexfl campaign run --emulate")
    target: Target = LocalTarget(emulate=args.emulate, fleet=args.fleet)
    rerun = shlex.join(["flexfl", *sys.argv[1:]]) if sys.argv[1:2] == ["campaign"] else \
        f"flexfl campaign run {args.file}" + (" --emulate" if args.emulate else "") + \
        (f" --fleet {args.fleet}" if args.fleet else "")
    print(f"campaign {campaign.name}: {len(campaign.runs)} runs on {target.label} into {out}", flush=True)
    runner = CampaignRunner(campaign, out=out, target=target, rerun=rerun,
                            report=lambda line: print(line, flush=True),
                            after_run=lambda run_dir: print(report_line(run_dir), flush=True))
    with sigterm_as_interrupt():
        index = runner.run()
    print(report_line(out), flush=True)
    failed = [r for r in index.runs if r.problems]
    if failed:
        raise LiveRunError(f"{len(failed)} of {len(index.runs)} runs ended with problems: "
                           + "; ".join(f"{r.name}: {'; '.join(r.problems)}" for r in failed))
    return 0
