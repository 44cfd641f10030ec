"""Load generators: CPU pressure with stress-ng, bandwidth shaping with tc, and the control
daemon that drives both over ZeroMQ (see README.md in this folder for the wire schema); and
the emulated fleet built from them: a network namespace, veth link, tbf qdiscs and cgroup CPU
quota per device."""
