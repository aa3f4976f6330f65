"""`miserver serve ...`: the command line."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from . import settings as settings_mod

log = logging.getLogger("miserver")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="miserver",
        description="miserver: an OpenAI-compatible inference server with SAE steering.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve", help="serve the /v1 API (default model: SmolLM2-135M-Instruct)"
    )
    settings_mod.add_flags(serve)
    return parser


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from .app import Server

    settings = settings_mod.from_args(args)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    server = Server(settings)
    log.info(
        "serving %s on http://%s:%d/v1", server.launch_model_id(), settings.host, settings.port
    )
    uvicorn.run(
        server, host=settings.host, port=settings.port, log_level=settings.log_level, lifespan="on"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    commands = {"serve": serve}
    sys.exit(commands[args.command](args))


if __name__ == "__main__":
    main()
