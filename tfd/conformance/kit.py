"""``tfd conformance``: run the gates of a profile against a live server, or compare two reports.

The census at the start is taken before any request (the server should be idle); the gates that
need the admin socket (cancel, evict) are skipped without one, and a run with a skipped gate does
not pass: the contract was not checked whole.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import attrs

from tfd.conformance import report
from tfd.conformance.client import Client
from tfd.conformance.gates import PROFILES, Gates, lead_past
from tfd.conformance.report import Report, Row
from tfd.conformance.soak import soak
from tfd.conformance.tool_gate import ToolGate


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
    lead, budget, lead_tokens = lead_past(client, profile)
    gates = Gates(client, profile, lead)
    admin = client.admin_path is not None
    at_start = client.census() if admin else {}
    settings = client.admin("settings")["rows"] if admin else []
    context = setting(settings, "TF_CONTEXT")
    lanes = int(client.admin("pool")["report"]["lane_slots"]) if admin else 8
    rows: list[Row] = [*gates.repeat(), *gates.concurrent(), *gates.drafted(), *gates.resumed(),
                       *gates.refusals(context), *ToolGate(client, profile).rows()]
    skipped = {}
    if admin:
        rows += gates.cancel(at_start, lanes)
        rows += gates.evict()
    else:
        skipped = {"cancel": "no --admin socket", "evict": "no --admin socket"}
    return Report(url, profile_name, tuple(rows), skipped, budget, lead_tokens)


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
    if args.soak is not None:
        return soaked(client, args)
    try:
        checked = check(client, args.url, args.profile)
    except (OSError, ValueError) as error:
        print(f"tfd conformance: {args.url}: {error}", file=sys.stderr)
        return 1
    print(report.table(checked))
    if args.json:
        checked.write(Path(args.json))
    return 0 if checked.ok else 1


def soaked(client: Client, args: argparse.Namespace) -> int:
    """``--soak``: the mix for ``args.soak`` seconds; 0 when nothing failed or leaked."""
    if client.admin_path is None:
        print("tfd conformance: --soak needs --admin (the census and memory come from it)", file=sys.stderr)
        return 2
    try:
        found = soak(client, args.soak, args.clients, requests=args.requests,
                     flat=None if args.flat is None else args.flat / 100)
    except (OSError, ValueError) as error:
        print(f"tfd conformance: {args.url}: {error}", file=sys.stderr)
        return 1
    print("\n".join(found.lines()))
    if args.json:
        Path(args.json).write_text(json.dumps({**attrs.asdict(found), "ok": found.ok}, indent=2) + "\n")
    return 0 if found.ok else 1
