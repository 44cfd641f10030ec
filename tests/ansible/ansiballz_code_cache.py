"""A compile cache for the code Ansible's modules import from their AnsiballZ payload (emulated test targets).

A module runs on the target as one Python process that imports the module and ansible.module_utils straight
from the payload zip, and zipimport compiles every file's source each time (it writes no bytecode). Under
qemu-user that is most of a task's cost: `ansible.module_utils.basic` took 3.1 s to import, and a ping module
4.0-4.5 s of CPU, on every task of every playbook run (a bare `python3 -c pass` 0.7 s). conftest.py puts this
file, and a .pth that imports it, into the target's /usr/local/lib/python3.X/dist-packages, which the system
python3 that runs the modules reads at start (venvs do not). Then zipimport's compile step keeps each code
object under CACHE, keyed by the file's path inside the payload and its source, and later runs load it instead
of compiling: the same ping took 2.2-3.1 s of CPU. Nothing else changes: the code is the compiler's output for
the same source, with the file name of the import at hand; files outside a payload compile as before.
"""

from __future__ import annotations

import marshal
import os
import sys
import zipimport
import zlib  # zipimport has it loaded already; hashlib would load OpenSSL, ~0.2 s under qemu

CACHE = "/var/cache/flexfl-test-ansiballz"
PAYLOAD = "_payload.zip" + os.sep
_compile = zipimport._compile_source  # type: ignore[attr-defined]


def _renamed(code, filename: str):  # type: ignore[no-untyped-def]
    """code and every code object nested in it with co_filename set to filename."""
    consts = tuple(_renamed(c, filename) if isinstance(c, type(code)) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def _compile_source(pathname: str, source: bytes):  # type: ignore[no-untyped-def]
    zip_path, found, inner = pathname.partition(PAYLOAD)
    if not found or not os.path.basename(zip_path).startswith("ansible_"):
        return _compile(pathname, source)
    # The entry holds the source it was compiled from: a hit is a byte-for-byte equal source.
    name = f"{inner.replace(os.sep, '%')}-{len(source)}-{zlib.crc32(source):08x}.{sys.implementation.cache_tag}"
    entry = os.path.join(CACHE, name)
    try:
        with open(entry, "rb") as cached:
            cached_source, code = marshal.load(cached)
        if cached_source == source:
            return _renamed(code, pathname)
    except (OSError, EOFError, ValueError, TypeError):
        pass
    code = _compile(pathname, source)
    try:
        os.makedirs(CACHE, mode=0o700, exist_ok=True)
        partial = f"{entry}.{os.getpid()}"
        with open(partial, "wb") as out:
            marshal.dump((source, code), out)
        os.replace(partial, entry)
    except OSError:
        pass
    return code


zipimport._compile_source = _compile_source  # type: ignore[attr-defined]
