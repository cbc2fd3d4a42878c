"""``python app.py``: the lora_gui dashboard on http://127.0.0.1:7860.

Binding to another address (``--host 0.0.0.0``) exposes training controls to the network, so it
requires ``--auth user:pass`` or an explicit ``--no-auth``.
"""

from __future__ import annotations

import argparse
import logging
import sys

log = logging.getLogger("lora_gui.app")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="lora_gui dashboard")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=7860)
    parser.add_argument("--auth", help="user:pass required to open the page")
    parser.add_argument("--no-auth", action="store_true", help="allow a public --host without auth")
    args = parser.parse_args(argv)
    if args.auth and ":" not in args.auth:
        parser.error("--auth must be user:pass")
    if args.host not in ("127.0.0.1", "localhost", "::1") and not (args.auth or args.no_auth):
        parser.error(f"--host {args.host} exposes the trainer to the network: add --auth user:pass "
                     "or --no-auth")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.no_auth and args.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("serving on %s without authentication: anyone who can reach it can start jobs",
                    args.host)
    from lora_gui.ui.app import CSS, build_app

    auth = tuple(args.auth.split(":", 1)) if args.auth else None
    build_app().launch(server_name=args.host, server_port=args.port, auth=auth, css=CSS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
