"""The host's CPU as agents report it and as benchmarks print it, from /proc/cpuinfo text."""

import platform

from loadgen.hostinfo import cpu_description, cpu_model, host_facts

X86 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC
flags\t\t: fpu vme

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: Other CPU
"""

PI = """processor\t: 0
BogoMIPS\t: 108.00
CPU part\t: 0xd08

Hardware\t: BCM2835
Model\t\t: Raspberry Pi 4 Model B Rev 1.4
"""


def test_an_x86_cpu_is_named_with_its_family_and_model_from_the_first_processor(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(X86)
    assert cpu_model(cpuinfo=info) == "AMD EPYC"
    assert cpu_description(cpuinfo=info) == "AMD EPYC (family 26, model 2)"


def test_a_pi_is_named_by_its_board_without_family_numbers(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(PI)
    assert cpu_model(cpuinfo=info) == "Raspberry Pi 4 Model B Rev 1.4"
    assert cpu_description(cpuinfo=info) == "Raspberry Pi 4 Model B Rev 1.4"


def test_an_unreadable_cpuinfo_falls_back_to_what_platform_knows(tmp_path):
    missing = tmp_path / "absent"
    assert cpu_model(cpuinfo=missing) == (platform.processor() or None)
    assert cpu_description(cpuinfo=missing) == (platform.processor() or platform.machine() or "unknown CPU")


def test_host_facts_carry_this_machines_cpu_model():
    assert host_facts()["cpu_model"] == cpu_model()
