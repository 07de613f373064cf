"""The ``tfd`` command: serve | admin | generate | bench | train-demo | env.

The environment is read and checked before anything heavy is imported, so a refused configuration
exits with status 2 at once and names every problem.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from tfd import __version__
from tfd.arguments import natural, positive, positive_float
from tfd.bench.flags import add_bench_parser
from tfd.env import FAMILY_SCOPES, SettingsRefused, Table
from tfd.exit_status import EXIT_FAILURE, EXIT_INTERRUPTED
from tfd.server.admin_commands import COMMANDS as ADMIN_COMMANDS
from tfd.train.recipe import MTP_TARGETS, SAFETY_MINUTES, Recipe

TRAIN_ROWS = ("TF_DEVICE", "TF_LOG_LEVEL")  # the rows `tfd train-demo` reads
DEFAULT_RECIPE = Recipe()


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Entry point of the console script and of ``python -m tfd``."""
    table = Table.load()
    parser = build_parser(table)
    args = parser.parse_args(argv)
    try:
        status = args.command(table, args)
    except SettingsRefused as refused:
        print(f"tfd: {refused}", file=sys.stderr)
        status = SettingsRefused.EXIT_STATUS
    except KeyboardInterrupt:
        status = EXIT_INTERRUPTED
    sys.exit(status)


def build_parser(table: Table) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tfd", description="Serving daemon for hybrid linear-attention language models.")
    parser.add_argument("--version", action="version", version=f"tfd {__version__}")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the daemon",
                                description="Run the daemon. Every flag is a row of `tfd env`.")
    table.add_flags(serve)
    serve.set_defaults(command=run_serve)

    admin = commands.add_parser("admin", help="send a command to a running daemon",
                                description="Send one admin command; print the JSON answer. "
                                "Exit 0 when the daemon answers ok, 1 otherwise.",
                                epilog="commands:\n" + "\n".join(f"  {name:9} {what}"
                                                                  for name, what in ADMIN_COMMANDS.items()),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    admin.add_argument("cmd", metavar="CMD", help="one of the commands below")
    admin.add_argument("args", metavar="ARG", nargs="*", help="the command's arguments")
    admin.add_argument("--socket", dest="TF_ADMIN_SOCKET", metavar="PATH",
                       help="the daemon's admin socket [TF_ADMIN_SOCKET]")
    admin.set_defaults(command=run_admin)

    generate = commands.add_parser(
        "generate", help="greedy continuation of a prompt through the engine, without a server",
        description="Print the greedy continuation of a prompt on standard output; load time and "
        "speed go to standard error.")
    generate.add_argument("--prompt", required=True, help="the text to continue")
    generate.add_argument("--max-tokens", type=positive, default=64, metavar="N",
                          help="most tokens to generate (default 64)")
    generate.add_argument("--chat", action="store_true",
                          help="send the prompt as a user message through the chat template")
    generate.add_argument("--random-weights", action="store_true",
                          help="draw the weights at random in the shapes of the model's config.json")
    table.add_flags(generate, scopes=("core",))
    generate.set_defaults(command=run_generate)

    add_bench_parser(commands, table, run_bench)

    train = commands.add_parser(
        "train-demo", help="train the embedded Qwen3.5 demo on the Python standard library's sources",
        description="Train the embedded qwen3_5 demo model, MTP head included, from its seeded random "
        "weights on every *.py of the standard library (AdamW, warmup and cosine decay, bf16 autocast on "
        "CUDA); write a checkpoint directory like the demo's with training.json: the recipe, the log, "
        "validation loss and how often the head's drafts are right.")
    train.add_argument("--out", type=Path, required=True, metavar="DIR",
                       help="the checkpoint directory to write (absent or empty)")
    train.add_argument("--steps", type=positive, default=DEFAULT_RECIPE.steps, metavar="N",
                       help=f"optimizer steps ({DEFAULT_RECIPE.steps})")
    train.add_argument("--batch", type=positive, default=DEFAULT_RECIPE.batch, metavar="B",
                       help=f"windows a step ({DEFAULT_RECIPE.batch})")
    train.add_argument("--seq", type=positive, default=DEFAULT_RECIPE.seq, metavar="L",
                       help=f"tokens a window ({DEFAULT_RECIPE.seq})")
    train.add_argument("--lr", type=positive_float, default=DEFAULT_RECIPE.lr, metavar="X",
                       help=f"peak learning rate ({DEFAULT_RECIPE.lr})")
    train.add_argument("--seed", type=natural, default=DEFAULT_RECIPE.seed, metavar="S",
                       help=f"seed of the windows' draw ({DEFAULT_RECIPE.seed}; the init is always the "
                       "demo's)")
    train.add_argument("--mtp-target", choices=MTP_TARGETS, default=DEFAULT_RECIPE.mtp_target,
                       help="what the MTP head learns: the text two tokens ahead, or the main model's own "
                       f"next distribution (self-distillation) ({DEFAULT_RECIPE.mtp_target})")
    train.add_argument("--minutes", type=positive_float, default=SAFETY_MINUTES, metavar="M",
                       help=f"stop training after this wall time, whatever --steps says ({SAFETY_MINUTES})")
    train.add_argument("--log-every", type=positive, default=DEFAULT_RECIPE.log_every, metavar="N",
                       help=f"steps between log lines ({DEFAULT_RECIPE.log_every})")
    train.add_argument("--corpus", type=Path, metavar="DIR",
                       help="train on every *.py under DIR instead of the standard library")
    table.add_flags(train, scopes=("core",), only=TRAIN_ROWS)
    train.set_defaults(command=run_train_demo)

    kit = commands.add_parser("conformance", help="check a live server against the contract",
                              description="Run the contract's gates against a running tfd through its HTTP "
                              "API and admin socket and print a table; exit 0 only when every gate holds. "
                              "Or compare two reports key by key.")
    kit.add_argument("--url", metavar="URL", help="the server, http://host:port")
    kit.add_argument("--admin", metavar="SOCKET",
                     help="its admin socket (the cancel and evict gates need it)")
    kit.add_argument("--api-key", metavar="KEY", help="a key of its TF_API_KEYS, when it wants one")
    kit.add_argument("--profile", choices=["quick", "full"], default="quick",
                     help="quick: 3 prompts, 1-4 streams; full: 10 prompts, 1-8 streams, drafts on and off")
    kit.add_argument("--json", metavar="OUT", help="write the report, every row's key and value, here")
    kit.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two reports key by key")
    kit.add_argument("--soak", type=positive_float, metavar="SECONDS",
                     help="instead of the gates, a random mix of requests, cancels included, for SECONDS: "
                     "requests, tokens, errors by kind, leaks and memory (needs --admin)")
    kit.add_argument("--clients", type=positive, default=4, metavar="N",
                     help="the soak's clients at once (4)")
    kit.add_argument("--requests", type=positive, metavar="N",
                     help="the soak ends sooner, once its clients have sent N requests between them "
                     "(shared out evenly: the same mix on any machine)")
    kit.add_argument("--flat", type=positive_float, metavar="PCT",
                     help="the soak also fails when resident or device memory grows by more than PCT percent "
                     "from once it settles (a fifth of the way in) to its end")
    kit.set_defaults(command=run_conformance)

    env = commands.add_parser("env", help="the environment table",
                              description="Print the environment table with current values.")
    mode = env.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true",
                      help="check the current environment, every family scope included; exit 2 if refused")
    mode.add_argument("--markdown", action="store_true", help="render docs/environment.md")
    mode.add_argument("--env-file", action="store_true", help="render env/tfd.env")
    env.set_defaults(command=run_env)
    return parser


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def run_serve(table: Table, args: argparse.Namespace) -> int:
    from tfd.checkpoint import CheckpointError

    flags = table.flag_values(args)
    try:
        family = served_family(table, flags)
    except CheckpointError as error:  # TF_MODEL names no checkpoint: a restart would not mend it
        print(f"tfd: {SettingsRefused([f'TF_MODEL: {error}'])}", file=sys.stderr)
        return SettingsRefused.EXIT_STATUS
    # The served family's rows are read in the same pass as the rest, before torch loads; with
    # no family known (its own rows malformed) every family's rows are checked.
    settings = table.read(os.environ, flags, families=[family] if family else FAMILY_SCOPES)
    configure_logging(settings.value("TF_LOG_LEVEL", str))

    import trio

    from tfd.server.daemon import Daemon, describe

    failures: list[BaseException] = []
    refusals: list[BaseException] = []
    try:
        return trio.run(Daemon(settings).run)
    except* SettingsRefused as group:
        refusals = _leaves(group)
    except* CheckpointError as group:  # a checkpoint that cannot be served: a restart would not mend it
        named = next((name for name in ("TF_MODEL", "TF_SHAPE") if settings.optional(name, str)), "TF_DEMO")
        refusals += [SettingsRefused([f"{named}: {error}" for error in _leaves(group)])]
    except* OSError as group:
        failures = _leaves(group)
    for refusal in refusals:
        print(f"tfd: {refusal}", file=sys.stderr)
    for failure in failures:
        print(f"tfd: cannot start: {describe(failure)}", file=sys.stderr)
    return SettingsRefused.EXIT_STATUS if refusals else EXIT_FAILURE


def served_family(table: Table, flags: dict[str, str]) -> str | None:
    """The family ``tfd serve`` will load, from TF_MODEL's config.json, TF_SHAPE or TF_DEMO (no torch);
    None when those rows themselves are malformed (the full read names them)."""
    from tfd.checkpoint import read_config
    from tfd.demo import DEMOS
    from tfd.shapes import PRESETS

    try:
        rows = table.read(os.environ, flags, only=["TF_MODEL", "TF_SHAPE", "TF_DEMO"])
    except SettingsRefused:
        return None
    model, shape = rows.optional("TF_MODEL", str), rows.optional("TF_SHAPE", str)
    if shape is not None:
        return PRESETS[shape][0]
    return read_config(Path(model)).family if model else DEMOS[rows.value("TF_DEMO", str)][0]


def run_admin(table: Table, args: argparse.Namespace) -> int:
    from tfd.server.admin import SERVICE_SOCKET, call, socket_path

    flags = {"TF_ADMIN_SOCKET": args.TF_ADMIN_SOCKET} if args.TF_ADMIN_SOCKET else {}
    settings = table.read(os.environ, flags, only=["TF_ADMIN_SOCKET"])
    explicit = settings.optional("TF_ADMIN_SOCKET", str)
    path, _ = socket_path(explicit, os.environ)
    tried = [path]
    if not explicit and not path.exists() and Path(SERVICE_SOCKET).exists():
        path = Path(SERVICE_SOCKET)  # the systemd unit's place, for an operator's shell
        tried.append(path)
    try:
        answer = call(path, args.cmd, args.args)
    except (OSError, ValueError) as error:
        where = " or ".join(str(p) for p in tried)
        print(f"tfd admin: no daemon answered on {where}: {error}", file=sys.stderr)
        return EXIT_FAILURE
    print(json.dumps(answer, indent=2))
    return 0 if answer.get("ok") is True else EXIT_FAILURE


def run_conformance(table: Table, args: argparse.Namespace) -> int:
    from tfd.conformance.kit import main as conformance

    return conformance(args)


def run_generate(table: Table, args: argparse.Namespace) -> int:
    settings = table.read(os.environ, table.flag_values(args))
    configure_logging(settings.value("TF_LOG_LEVEL", str))

    import torch

    from tfd.checkpoint import CheckpointError
    from tfd.generate import generate
    from tfd.models import load

    try:
        loaded = load(settings, os.environ, torch.device("cpu"), args.random_weights)
    except CheckpointError as error:
        print(f"tfd generate: {error}", file=sys.stderr)
        return EXIT_FAILURE
    prompt = args.prompt
    if args.chat:
        if loaded.template is None:
            print("tfd generate: the checkpoint has no chat template", file=sys.stderr)
            return EXIT_FAILURE
        prompt = loaded.template.render([{"role": "user", "content": prompt}])
    ids = loaded.tokenizer.encode(prompt, add_special_tokens=False).ids
    done = generate(loaded.model, ids, args.max_tokens, stop=loaded.eos_ids)
    shown = [t for t in done.tokens if t not in loaded.eos_ids]
    print(loaded.tokenizer.decode(shown))
    logging.getLogger("tfd.generate").info(
        "prefill %d tokens in %.3fs (%.1f tok/s); %d tokens in %.3fs (%.1f tok/s)", len(ids), done.prefill_s,
        len(ids) / max(done.prefill_s, 1e-9), len(done.tokens), done.decode_s,
        len(done.tokens) / max(done.decode_s, 1e-9))
    return 0


def run_bench(table: Table, args: argparse.Namespace) -> int:
    from tfd.bench.serve_command import EXIT_REFUSED, conflicts, engine_defaults

    problem = conflicts(args)
    if problem is not None:
        print(f"tfd bench: {problem}", file=sys.stderr)
        return EXIT_REFUSED
    settings = table.read(os.environ, table.flag_values(args))
    configure_logging(settings.value("TF_LOG_LEVEL", str))
    if args.serve is not None:
        from tfd.bench.serve_command import main as serve

        return serve(settings, args)
    engine_defaults(args)
    from tfd.bench.tensor_parallel import conflicts as split_conflicts
    from tfd.bench.tensor_parallel import run_ranks

    problem = split_conflicts(args)
    if problem is not None:
        print(f"tfd bench: {problem}", file=sys.stderr)
        return EXIT_REFUSED
    if (args.tensor_parallel or 1) > 1:
        return run_ranks(settings, args)
    from tfd.bench.command import run

    return run(settings, args)


def run_train_demo(table: Table, args: argparse.Namespace) -> int:
    settings = table.read(os.environ, table.flag_values(args), only=TRAIN_ROWS)
    configure_logging(settings.value("TF_LOG_LEVEL", str))

    from tfd.train.written import check_out

    try:
        check_out(args.out)  # before any work: a run must not end unable to write
    except FileExistsError as error:
        print(f"tfd train-demo: {error}", file=sys.stderr)
        return EXIT_FAILURE

    from tfd.demo import DEMOS
    from tfd.server.service import pick_device
    from tfd.train.corpus import Corpus
    from tfd.train.loop import DEMO, train
    from tfd.train.written import write

    device = pick_device(settings.value("TF_DEVICE", str))
    recipe = Recipe(steps=args.steps, batch=args.batch, seq=args.seq, lr=args.lr, seed=args.seed,
                    minutes=args.minutes, log_every=args.log_every, mtp_target=args.mtp_target)
    log = logging.getLogger("tfd.train")
    try:
        corpus = Corpus.read(args.corpus)
        log.info("corpus: %s", json.dumps(corpus.summary()))
        trained = train(recipe, corpus, device)
        record = write(args.out, trained, recipe, corpus, device, DEMOS[DEMO][1])
    except (OSError, ValueError) as error:
        print(f"tfd train-demo: {error}", file=sys.stderr)
        return EXIT_FAILURE
    print(json.dumps({"out": str(args.out), "steps": record["steps"], "seconds": record["seconds"],
                      "validation": record["validation"]["after"]}))
    return 0


def run_env(table: Table, args: argparse.Namespace) -> int:
    from tfd.env_docs import render_envfile, render_markdown, render_text

    if args.markdown:
        sys.stdout.write(render_markdown(table))
    elif args.env_file:
        sys.stdout.write(render_envfile(table))
    elif args.check:
        settings = table.read(os.environ, families=FAMILY_SCOPES)
        given = sum(1 for row in settings.effective() if row["source"] == "environment")
        print(f"tfd env: {len(table.rows)} settings ok, {given} set in the environment")
    else:
        sys.stdout.write(render_text(table, os.environ))
    return 0


def _leaves(group: BaseException) -> list[BaseException]:
    if isinstance(group, BaseExceptionGroup):
        return [leaf for inner in group.exceptions for leaf in _leaves(inner)]
    return [group]
