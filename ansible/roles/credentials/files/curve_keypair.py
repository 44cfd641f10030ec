"""Make a loadgen CURVE keypair on the controller, unless a valid one is there already.

Runs under the controller's Python (the one running Ansible, which needs pyzmq: `make
setup-ansible` installs it) with FlexFL's own key code from the checkout, so the files are
exactly what `flexfl loadgen keys` writes: DIR/NAME.key and DIR/NAME.key_secret. Both are
left 0600 here: the controller's copies are private, the role pushes the public one 0644.
Prints one JSON line: {"changed": bool, "public": path, "secret": path}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkout", type=Path, required=True, help="the FlexFL checkout (has loadgen/keys.py)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--name", required=True)
    args = parser.parse_args()
    sys.path.insert(0, str(args.checkout.resolve()))
    try:
        from loadgen import keys
    except ImportError as exc:
        print(f"cannot load FlexFL's key code from {args.checkout} ({exc}); the controller's Ansible "
              "Python needs pyzmq: `make setup-ansible` installs ansible/requirements.txt", file=sys.stderr)
        return 2

    public = args.out / f"{args.name}{keys.PUBLIC_SUFFIX}"
    secret = args.out / f"{args.name}{keys.SECRET_SUFFIX}"
    changed = True
    try:
        changed = keys.load_keypair(secret).public != keys.load_public_key(public)
    except keys.KeyFileError:
        pass  # missing or broken: make a new pair
    if changed:
        keys.write_keypair(args.out, args.name, overwrite=True)
    for path in (public, secret):
        os.chmod(path, 0o600)
    print(json.dumps({"changed": changed, "public": str(public), "secret": str(secret)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
