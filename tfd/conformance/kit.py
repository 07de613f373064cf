"""``tfd conformance``: run the gates of a profile against a live server, or compare two reports.

The census at the start is taken before any request (the server should be idle); the gates that
need the admin socket (cancel, evict) are skipped without one, and a run with a skipped gate does
not pass: the contract was not checked whole.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tfd.conformance import report
from tfd.conformance.client import Client
from tfd.conformance.gates import PROFILES, Gates
from tfd.conformance.report import Report, Row


def setting(rows: list[dict[str, object]], name: str) -> int | None:
    """An integer setting among the server's ``rows`` (admin ``settings``)."""
    value = next((row["value"] for row in rows if row["name"] == name), None)
    try:
        return int(str(value))
    except ValueError:  # unset, or "auto"
        return None


def check(client: Client, url: str, profile_name: str) -> Report:
    """Every gate of ``profile_name`` against ``client``."""
    profile = PROFILES[profile_name]
    gates = Gates(client, profile)
    admin = client.admin_path is not None
    at_start = client.census() if admin else {}
    settings = client.admin("settings")["rows"] if admin else []
    context = setting(settings, "TF_CONTEXT")
    lanes = setting(settings, "TF_PARALLEL") or 8
    rows: list[Row] = [*gates.repeat(), *gates.concurrent(), *gates.drafted(), *gates.resumed(),
                       *gates.refusals(context)]
    skipped = {}
    if admin:
        rows += gates.cancel(at_start, lanes)
        rows += gates.evict()
    else:
        skipped = {"cancel": "no --admin socket", "evict": "no --admin socket"}
    return Report(url, profile_name, tuple(rows), skipped)


def main(args: argparse.Namespace) -> int:
    """The command: 0 when every gate holds (or two reports agree on every key they share)."""
    if args.compare:
        first, second = (report.read(Path(path)) for path in args.compare)
        found = report.compare(first, second)
        print(f"tfd conformance --compare: {found.words()}")
        for key in found.differ:
            print(f"  differs: {key}")
        return 0 if not found.differ and found.keys else 1
    if not args.url:
        print("tfd conformance: give --url (or --compare A.json B.json)", file=sys.stderr)
        return 2
    client = Client(args.url, args.api_key, Path(args.admin) if args.admin else None)
    try:
        checked = check(client, args.url, args.profile)
    except (OSError, ValueError) as error:
        print(f"tfd conformance: {args.url}: {error}", file=sys.stderr)
        return 1
    print(report.table(checked))
    if args.json:
        checked.write(Path(args.json))
    return 0 if checked.ok else 1
