"""``python app.py``: the lora_gui dashboard on http://127.0.0.1:7860.

Binding to another address (``--host 0.0.0.0``) exposes training controls to the network, so it
requires ``--auth user:pass`` (or ``--auth-file``) or an explicit ``--no-auth``. Paths typed in
the page (data, model, export folders) stay inside the working directory, the runs folder, the
bundled assets and presets and the ``--allow-path`` folders, unless ``--allow-any-path``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

log = logging.getLogger("lora_gui.app")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="lora_gui dashboard")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=7860)
    parser.add_argument("--auth", action="append", default=[], metavar="USER:PASS",
                        help="a login required to open the page and call its API (repeatable)")
    parser.add_argument("--auth-file", help="a file of logins, one user:pass a line ('#' comments)")
    parser.add_argument("--no-auth", action="store_true", help="allow a public --host without auth")
    parser.add_argument("--allow-path", action="append", default=[], metavar="DIR",
                        help="a folder that paths typed in the page may reach, besides the working "
                             "directory, runs/, assets/ and presets/ (repeatable)")
    parser.add_argument("--allow-any-path", action="store_true",
                        help="paths typed in the page may reach any folder this user can")
    args = parser.parse_args(argv)
    args.logins = logins(parser, args.auth, args.auth_file)
    for folder in args.allow_path:
        if not Path(folder).expanduser().is_dir():
            parser.error(f"--allow-path {folder}: not a folder")
    if args.host not in ("127.0.0.1", "localhost", "::1") and not (args.logins or args.no_auth):
        parser.error(f"--host {args.host} exposes the trainer to the network: add --auth user:pass "
                     "or --no-auth")
    return args


def logins(parser: argparse.ArgumentParser, pairs: list[str], auth_file: str | None,
           ) -> list[tuple[str, str]]:
    """(user, password) pairs from --auth and --auth-file; a bad one stops with its place named."""
    found = []
    for pair in pairs:
        user, sep, password = pair.partition(":")
        if not (sep and user and password):
            parser.error("--auth must be user:pass (both non-empty)")
        found.append((user, password))
    if auth_file:
        try:
            lines = Path(auth_file).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as err:
            parser.error(f"--auth-file {auth_file}: cannot be read ({err})")
        for number, line in enumerate(lines, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            user, sep, password = line.partition(":")
            if not (sep and user.strip() and password):
                parser.error(f"--auth-file {auth_file}, line {number}: not user:pass")
            found.append((user.strip(), password))
        if not found:
            parser.error(f"--auth-file {auth_file}: no user:pass line")
    return found


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.no_auth and args.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("serving on %s without authentication: anyone who can reach it can start jobs",
                    args.host)
    serve(args)
    return 0


def serve(args: argparse.Namespace, block: bool = True):
    """Builds the dashboard and serves it as the flags say; ``block=False`` returns the running
    app (gradio.Blocks) at once (tests)."""
    from lora_gui.ui import login_wall, paths
    from lora_gui.ui.app import CSS, build_app

    paths.configure(args.allow_path, any_path=args.allow_any_path)
    demo = build_app()
    # run_history off: the browser would keep every timer tick's charts, and "runs" there is not
    # the Runs tab
    import gradio as gr

    # gradio announces a finished event with the key "common.complete", which its English
    # translations lack: the page would show the raw key (for a moment, in the Runs tab's text)
    words = gr.I18n(en={"common.complete": "Done", "common.error": "Error"})
    demo.launch(server_name=args.host, server_port=args.port, auth=args.logins or None, css=CSS, i18n=words,
                auth_message="lora_gui: log in with a user given to --auth or --auth-file",
                run_history=False, prevent_thread_lock=not block, quiet=not block,
                app_kwargs=login_wall.app_kwargs())  # with --auth: nothing answers without the login
    return demo


if __name__ == "__main__":
    sys.exit(main())
