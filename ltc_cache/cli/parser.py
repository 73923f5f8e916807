"""The arguments of ``ltc-cache``: the tier options, which work before or
after the command, and each command's own."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, NoReturn

from ..errors import BadArgument
from ..graph.fused.cpu_isa import parse_cpu
from ..report import SORT_FIELDS, parse_filter
from ..units import SIZE_RULE, parse_age, parse_size
from .fuse import cmd_fuse
from .inspection import cmd_ls, cmd_show, cmd_stats, cmd_verify
from .maintenance import cmd_clear, cmd_export, cmd_import, cmd_prune
from .output import USAGE


def _arg(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = parse.__name__
    return convert


def _timeout(text: str) -> float:
    """Seconds, or a number with s, m or h, more than 0: no limit at all
    is refused, as LTC_CACHE_FUSE_TIMEOUT refuses it (a hung compile would
    hold the run forever)."""
    try:
        seconds = parse_age(text)
    except ValueError:
        raise BadArgument(f"not a number of seconds: {text!r} (e.g. 600, 10m, 1h)") from None
    if seconds <= 0:
        raise BadArgument(f"timeout {text!r}: must be more than 0 seconds")
    return seconds


class _Parser(argparse.ArgumentParser):
    """A usage error is one line (and exit 2), not the whole usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _global_options(parser: argparse.ArgumentParser, default: Any) -> None:
    # On the main parser and on every command, so they work before or after
    # it (`ltc-cache show KEY --dir X`); a command's copy leaves the value
    # alone unless given there.
    parser.add_argument("--dir", metavar="DIR", default=default,
                        help="cache directory (default: LTC_CACHE_DIR, else the user cache dir)")
    parser.add_argument("--remote", metavar="URL", default=default,
                        help="the Redis tier too (default: LTC_CACHE_REMOTE); alone, without "
                        "--dir, the Redis tier only")
    parser.add_argument("--local", action="store_true", default=default,
                        help="the cache directory only, even with LTC_CACHE_REMOTE set")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ltc-cache",
        description="Inspect and maintain an ltc_cache directory of compiled LTC graphs, "
                    "and the Redis tier under it.",
        epilog=f"Sizes: {SIZE_RULE}. Ages: seconds, or a number with s, m, h, d, w or y. "
               "Exit status: 0 fine, 1 problems found, 2 usage error, 130 interrupted.")
    _global_options(parser, None)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, run: Callable[..., int], help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help)
        _global_options(sub, argparse.SUPPRESS)
        sub.set_defaults(run=run)
        return sub

    def filters(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--filter", action="append", default=[], type=_arg(parse_filter),
                         metavar="EXPR", help="FIELD OP VALUE, e.g. size>1MB, accessed>30d "
                         "(not used for 30 days), created<2h, hits=0, name=gpt2*; repeatable")

    ls = command("ls", cmd_ls, "list entries")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.add_argument("--sort", choices=sorted(SORT_FIELDS), default="accessed",
                    help="order by this (default: accessed, most recent first)")
    ls.add_argument("--reverse", "-r", action="store_true", help="reverse the order")
    filters(ls)

    stats = command("stats", cmd_stats, "entries, sizes and hit/miss counts of every process")
    stats.add_argument("--json", action="store_true", help="machine-readable output")
    stats.add_argument("--zero", action="store_true", help="reset the counters")

    show = command("show", cmd_show, "an entry's metadata, input layout and stored IR")
    show.add_argument("key", help="entry key or a unique prefix of it")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.add_argument("--no-ir", action="store_true", help="leave out the IR")

    def deleting(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--dry-run", action="store_true", help="show the plan, delete nothing")
        sub.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")

    prune = command("prune", cmd_prune, "delete entries by size, age or staleness")
    prune.add_argument("--max-size", type=_arg(parse_size), metavar="SIZE",
                       help="delete least recently used entries until the rest fit in SIZE "
                       "(0: all of them), e.g. 2GB")
    prune.add_argument("--older-than", type=_arg(parse_age), metavar="AGE",
                       help="delete entries not used for AGE, e.g. 30d, 12h")
    prune.add_argument("--stale", action="store_true",
                       help="delete entries of another torch version or entry schema")
    prune.add_argument("--cpu", action="append", default=[], type=_arg(parse_cpu),
                       metavar="FEATURES", help="keep only the fused libraries that a CPU of "
                       "FEATURES runs: 'here', or feature words such as 'avx2' or 'avx512 "
                       "avx512_vnni amx_tile'; repeatable, one for each kind of CPU of the fleet")
    deleting(prune)

    clear = command("clear", cmd_clear, "delete every entry")
    deleting(clear)

    check = command("verify", cmd_verify,
                    "check every entry (checksum, decoding, the IR parses, the "
                    "signatures of programs and fused libraries)")
    check.add_argument("--fix", action="store_true", help="delete the bad entries")
    check.add_argument("--json", action="store_true", help="machine-readable output")

    export = command("export", cmd_export, "write entries to one portable bundle file")
    export.add_argument("file", help="bundle to write")
    export.add_argument("--force", "-f", action="store_true", help="overwrite an existing FILE")
    export.add_argument("--key", action="append", default=[], metavar="PREFIX",
                        help="only this entry (repeatable)")
    filters(export)

    imports = command("import", cmd_import, "add the entries of a bundle, each checked first")
    imports.add_argument("file", help="bundle to read")

    fuse = command("fuse", cmd_fuse, "compile the fused libraries (AOTInductor) of stored "
                   "graphs ahead; Ctrl-C stops, running it again continues")
    fuse.add_argument("--retry", action="store_true",
                      help="compile again the graphs whose fused entry is a refusal")
    fuse.add_argument("--dry-run", action="store_true",
                      help="list what would be compiled, compile nothing")
    fuse.add_argument("--timeout", type=_arg(_timeout), metavar="SECONDS",
                      help="seconds one graph's compile may take before it is refused, "
                      "or with m or h (default: LTC_CACHE_FUSE_TIMEOUT, else 900)")
    fuse.add_argument("--key", action="append", default=[], metavar="PREFIX",
                      help="only this graph entry (repeatable)")
    filters(fuse)
    return parser
