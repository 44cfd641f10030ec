"""A timeline on the emulated fleet, without root: which settings hold at round r or second t, what changes when.

The fleet here records the calls it gets (the real one needs root: tests/netns/test_live_timeline.py
runs it); everything else is the real code.
"""

from __future__ import annotations

import logging

import pytest

from flexfl.errors import ConfigError
from loadgen.fleet import DEFAULT_CFS_PERIOD_US, least_quota_cpus
from loadgen.fleet_timeline import (
    UNLIMITED,
    Change,
    FleetTimeline,
    Settings,
    changes,
    clamp_warnings,
    quota_cpus,
    rate_kbit,
    settings_for,
)
from trace_recorder.timeline import Conditions, Interval, Timeline, TimeUnit

LEAST = least_quota_cpus(DEFAULT_CFS_PERIOD_US)  # 0.1 CPU at the fleet's 10 ms period


def _c(share: float = 1.0, up: float = 8000, down: float = 16000, online: bool = True) -> Conditions:
    return Conditions(cpu_share=share, up_kbit_s=up, down_kbit_s=down, online=online)


def _rounds(**devices: list[tuple[int, int, Conditions]]) -> Timeline:
    return Timeline(unit=TimeUnit.ROUND, devices={name.replace("_", "-"): [Interval(a, b, c) for a, b, c in rows]
                                                  for name, rows in devices.items()})


# dev-1 drops to 0.1 of its compute from round 4; dev-2 is offline in rounds 3 and 4 (a gap: uncovered is offline)
TIMELINE = _rounds(dev_0=[(1, 9, _c())], dev_1=[(1, 4, _c()), (4, 9, _c(share=0.1, up=800))],
                   dev_2=[(1, 3, _c()), (5, 9, _c(up=2000))])


def test_cpu_share_is_a_share_of_the_devices_cpus_or_of_one_core_without_a_quota_and_never_below_the_kernels_least():
    assert quota_cpus(0.5, full_cpus=0.5, least_cpus=LEAST) == (0.25, False)
    assert quota_cpus(1.0, full_cpus=None, least_cpus=LEAST) == (None, False)  # a full core: no quota to set
    assert quota_cpus(0.3, full_cpus=None, least_cpus=LEAST) == (pytest.approx(0.3), False)
    assert quota_cpus(0.2, full_cpus=0.25, least_cpus=LEAST) == (LEAST, True)  # 0.05 CPU: below 1 ms per 10 ms
    assert quota_cpus(0.0, full_cpus=1.0, least_cpus=LEAST) == (LEAST, True)
    assert rate_kbit(799.6) == (800, False) and rate_kbit(0.2) == (1, True) and rate_kbit(0) == (1, True)


def test_settings_for_online_conditions_and_offline_keeps_what_was_in_force():
    before = Settings(cpu_share=0.5, cpu_quota=0.125, up_kbit=800, down_kbit=1600, online=True)
    on = settings_for(_c(share=1.0, up=2000.4, down=0), before, full_cpus=0.25, least_cpus=LEAST)
    assert on == Settings(cpu_share=1.0, cpu_quota=0.25, up_kbit=2000, down_kbit=1, online=True)
    off = settings_for(_c(share=0.01, up=0, online=False), before, full_cpus=0.25, least_cpus=LEAST)
    assert off == Settings(cpu_share=0.5, cpu_quota=0.125, up_kbit=800, down_kbit=1600, online=False)


def test_changes_are_only_what_differs_with_the_link_last_going_offline_and_first_coming_back():
    a = Settings(cpu_share=1.0, cpu_quota=0.25, up_kbit=800, down_kbit=1600, online=True)
    assert changes("dev-1", a, a) == []
    assert changes("dev-1", a, Settings(0.8, 0.25, 800, 1600, True)) == []  # the same quota: nothing to set
    both = Settings(cpu_share=0.5, cpu_quota=0.125, up_kbit=400, down_kbit=1600, online=False)
    assert [c.what for c in changes("dev-1", a, both)] == ["cpu_quota", "up_kbit", "online"]
    assert [c.what for c in changes("dev-1", both, a)] == ["online", "cpu_quota", "up_kbit"]
    assert str(changes("dev-1", a, both)[0]) == "dev-1 CPU quota 0.25 CPU -> 0.125 CPU"
    assert str(Change("dev-2", "online", True, False)) == "dev-2 online -> offline"
    assert str(Change("dev-0", "up_kbit", None, 800)) == "dev-0 upload unshaped -> 800 kbit/s"


def test_a_round_timeline_sets_each_rounds_conditions_and_changes_only_what_differs(caplog, recording_fleet):
    fleet = recording_fleet
    ft = FleetTimeline(TIMELINE, full_cpus=[None, 0.5, None], least_cpus=LEAST, where="t.csv")
    assert ft.in_force == dict.fromkeys(["dev-0", "dev-1", "dev-2"], UNLIMITED)
    with caplog.at_level(logging.INFO, logger="loadgen.fleet_timeline"):
        first = ft.apply(fleet, 1)
    assert fleet.calls == [("up", 0, 8000), ("down", 0, 16000), ("cpu", 1, 0.5), ("up", 1, 8000), ("down", 1, 16000),
                           ("up", 2, 8000), ("down", 2, 16000)]  # dev-0, dev-2: share 1 of one core, no quota
    assert len(first) == 7 and "conditions at round 1: dev-1 CPU quota none -> 0.5 CPU" in caplog.text
    fleet.calls.clear()
    assert ft.apply(fleet, 2) == [] and fleet.calls == []  # round 2: as round 1
    assert [str(c) for c in ft.apply(fleet, 3)] == ["dev-2 online -> offline"]
    assert fleet.calls == [("online", 2, False)]
    fleet.calls.clear()
    ft.apply(fleet, 4)
    assert fleet.calls == [("cpu", 1, LEAST), ("up", 1, 800)]  # 0.1 x 0.5 CPU is below the least: clamped
    assert ft.in_force["dev-2"].online is False and ft.in_force["dev-1"].cpu_share == 0.1
    fleet.calls.clear()
    ft.apply(fleet, 5)  # dev-2 back, with the upload its new row gives
    assert fleet.calls == [("online", 2, True), ("up", 2, 2000)]
    fleet.calls.clear()
    ft.apply(fleet, 9)  # past every row: all offline, quotas and rates left as they were
    assert fleet.calls == [("online", 0, False), ("online", 1, False), ("online", 2, False)]


def test_apply_to_some_devices_leaves_the_others_as_they_are(recording_fleet):
    fleet = recording_fleet
    ft = FleetTimeline(TIMELINE, full_cpus=[None, None, None], least_cpus=LEAST, where="t.csv")
    ft.apply(fleet, 3, devices=[2])
    assert {i for _, i, _ in fleet.calls} == {2} and ft.in_force["dev-0"] == UNLIMITED


def test_a_second_timeline_is_read_at_the_time_given():
    t = Timeline(unit=TimeUnit.SECOND, devices={"dev-0": [Interval(0, 2.5, _c(share=1.0)),
                                                          Interval(2.5, 10, _c(share=0.5))]})
    ft = FleetTimeline(t, full_cpus=[1.0], least_cpus=LEAST, where="t.csv")
    assert ft.settings_at(0, 2.49).cpu_quota == 1.0 and ft.settings_at(0, 2.5).cpu_quota == 0.5
    assert ft.settings_at(0, 10.0).online is False


def test_a_timeline_for_other_devices_than_the_fleets_is_one_error_naming_both():
    with pytest.raises(ConfigError) as err:
        FleetTimeline(TIMELINE, full_cpus=[None, None], least_cpus=LEAST, where="t.csv")
    assert str(err.value) == ("t.csv: it names dev-2, which the fleet does not have (the fleet has 2 devices: "
                              "dev-0, dev-1; the timeline 3 devices: dev-0, dev-1, dev-2; --devices sets the "
                              "fleet's size)")
    with pytest.raises(ConfigError, match=r"^t.csv: it has no rows for dev-3 \(the fleet has 4 devices"):
        FleetTimeline(TIMELINE, full_cpus=[None] * 4, least_cpus=LEAST, where="t.csv")


def test_shares_and_rates_the_fleet_cannot_set_are_named_once_per_device():
    t = _rounds(dev_0=[(1, 3, _c(share=0.2)), (3, 5, _c(share=0.3, online=False)), (5, 9, _c(share=0.1, up=0))],
                dev_1=[(1, 9, _c(share=0.2))])
    lines = clamp_warnings(t, [0.25, None], least_cpus=LEAST, where="t.csv")
    assert lines == [
        "t.csv: dev-0: cpu_share 0.1 in 2 row(s) (first from 1) is below the kernel's least quota, 0.1 CPU = "
        "cpu_share 0.4 of its 0.25 CPU: those rows get 0.1 CPU (a larger --emulate-cpu makes lower shares reachable)",
        "t.csv: dev-0: a rate under 1 kbit/s in 1 online row(s) (first from 5): tbf has no rate 0, those rows get "
        "1 kbit/s",
    ]  # the offline row asks for nothing; dev-1's 0.2 of one core is above the least
