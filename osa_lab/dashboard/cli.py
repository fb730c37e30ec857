"""``osa-lab dashboard``: serve the Panel dashboard from the installed package.

Runs ``panel serve <osa_lab/dashboard/osa_dashboard.py> --warm [--show] --port PORT --address
ADDRESS`` with this Python, so the same environment (and osa_lab) is used. The entry script ships
inside the package, so this works from a wheel install as well as from a source checkout
(``panel serve dashboards/osa_dashboard.py`` is the same app). ``--warm`` computes the default
view at server start; the short unused-session settings make a closed tab's Jacobian worker stop
within about 6 s. The page works offline: Panel serves every script and stylesheet itself
(see ``docs/dashboard.md``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from osa_lab.errors import MissingDataError

#: The served entry script, shipped inside this package (the page's path is its stem).
APP_SCRIPT = Path(__file__).with_name("osa_dashboard.py")

#: Bokeh destroys a session this long after its browser tab closed (ms), checking this often;
#: destroying it stops the session's Jacobian worker (Bokeh's defaults: 15 s and 17 s, i.e. up to
#: 32 s). Not much shorter: a page whose websocket arrives later than the lifetime (slow page
#: load) gets a second, re-created session, which works (see ``serve_resources_locally``) but
#: computes the first view twice.
UNUSED_SESSION_LIFETIME_MS = 5000
CHECK_UNUSED_SESSIONS_MS = 1000


def app_path() -> Path:
    """Path of the dashboard entry script inside the installed package.

    ``OSA_LAB_DASHBOARD`` overrides it. Raises :class:`~osa_lab.errors.MissingDataError` (a
    ``FileNotFoundError``) with a hint when absent.
    """
    override = os.environ.get("OSA_LAB_DASHBOARD")
    path = Path(override) if override else APP_SCRIPT
    if not path.is_file():
        raise MissingDataError(
            f"dashboard script not found at {path}; reinstall osa_lab with its laboratory extra "
            "(pip install \"osa_lab[lab]\") or set OSA_LAB_DASHBOARD to the path of osa_dashboard.py"
        )
    return path


def results_folder(text: str) -> Path:
    """The absolute path of a study's results folder; :class:`MissingDataError` naming the fix when it is not one."""
    path = Path(text).expanduser().resolve()
    if not (path / "final").is_dir() and not (path / "tune").is_dir():
        raise MissingDataError(
            f"--results {text}: not a study's results folder (no final/ or tune/ inside); give the --output "
            "folder of `osa-lab train --experiment`, e.g. docs/results/mnist1d-depth"
        )
    return path


def port_number(text: str) -> int:
    """argparse type: a TCP port, 0 (any free port) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: give an int from 0 to 65535") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: give an int from 0 (any free port) to 65535")
    return value


def address(text: str) -> str:
    """argparse type: a non-empty host name or IP address without spaces."""
    if not text.strip() or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(f"invalid address {text!r}: give a host name or IP, e.g. localhost")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``osa-lab dashboard``."""
    from osa_lab.cli import positive_int

    parser.add_argument("--port", type=port_number, default=5006,
                        help="port to serve on (default 5006; 0 = any free port)")  # fmt: skip
    parser.add_argument("--address", type=address, default="localhost", help="address to bind (default localhost)")
    parser.add_argument("--show", action="store_true", help="open the page in a browser")
    parser.add_argument(
        "--allow-websocket-origin", action="append", default=None, metavar="HOST[:PORT]",
        help="extra websocket origin to allow (repeatable), e.g. for access through an SSH tunnel",
    )
    parser.add_argument("--num-threads", type=positive_int, default=None,
                        help="Panel thread pool size for callbacks (default: none; heavy work already runs in threads)")
    parser.add_argument("--results", default=None, metavar="DIR",
                        help="open the Runs view on this study results folder (the --output of `osa-lab train "
                             "--experiment`)")  # fmt: skip
    parser.add_argument("--dry-run", action="store_true", help="print the panel serve command and exit")


def build_command(args: argparse.Namespace) -> list[str]:
    """The ``panel serve`` command line for ``args``."""
    cmd = [sys.executable, "-m", "panel", "serve", str(app_path()), "--port", str(args.port),
           "--address", args.address, "--warm",
           "--unused-session-lifetime", str(UNUSED_SESSION_LIFETIME_MS),
           "--check-unused-sessions", str(CHECK_UNUSED_SESSIONS_MS)]
    if args.show:
        cmd.append("--show")
    for origin in args.allow_websocket_origin or []:
        cmd += ["--allow-websocket-origin", origin]
    if args.num_threads:
        cmd += ["--num-threads", str(args.num_threads)]
    return cmd


def run(args: argparse.Namespace) -> int:
    """Serve the dashboard until interrupted; returns panel's exit status."""
    try:
        cmd = build_command(args)
        results = results_folder(args.results) if getattr(args, "results", None) else None
    except FileNotFoundError as exc:
        print(f"osa-lab dashboard: error: {exc}", file=sys.stderr)
        return 2
    if results is not None:
        from osa_lab.dashboard.runs_view import RESULTS_ENV

        os.environ[RESULTS_ENV] = str(results)
    if args.dry_run:
        print(" ".join(cmd))
        return 0
    page = f"http://{args.address}:{args.port}/osa_dashboard" + ("?view=runs" if results is not None else "")
    print(f"serving {cmd[4]} at {page} (Ctrl-C to stop)", flush=True)
    if os.name == "posix":
        # Become the server (exec), so that SIGTERM/SIGINT sent to `osa-lab dashboard` reach it
        # directly: as a child it would outlive a terminated wrapper and keep serving.
        sys.stderr.flush()
        os.execv(cmd[0], cmd)
    try:  # elsewhere: a child process; Ctrl-C reaches both
        return subprocess.call(cmd)
    except KeyboardInterrupt:
        return 0
