"""Command line: `python -m sowviz demo -o report.html`, `python -m sowviz --help`."""

from __future__ import annotations

import argparse
import pathlib
import sys

from .modes import MODES

DESCRIPTION = """\
sowviz: see inside JAX programs.

commands:
  demo    inspect the built-in example (a small MLP whose gradients vanish
          in early layers and turn NaN at one stage) and write an offline,
          self-contained HTML report you can open in any browser.
"""


def _demo(args: argparse.Namespace) -> int:
    import sowviz

    from . import demo

    params, x = demo.init(), demo.batch()
    ins = sowviz.inspect(demo.loss, params, x, mode=args.mode, title="sowviz demo: a small MLP")
    path = ins.save_html(args.output)
    size = pathlib.Path(path).stat().st_size
    print(f"wrote {pathlib.Path(path).resolve()} ({size / 1e6:.2f} MB): open it in a browser")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sowviz",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="command")
    demo = sub.add_parser("demo", help="inspect the built-in example and write an HTML report")
    demo.add_argument(
        "-o", "--output", default="report.html", help="report path (default: report.html)"
    )
    demo.add_argument("--mode", default="all", choices=MODES, help="inspection mode (default: all)")
    demo.set_defaults(run=_demo)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
