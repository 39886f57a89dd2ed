"""Command line: `python -m sowviz demo -o report.html`,
`python -m sowviz report LOG_DIR [LOG_DIR ...] -o report.html`, `python -m sowviz --help`."""

from __future__ import annotations

import argparse
import pathlib
import sys

# The inspection modes of the public contract (docs/model.md).
MODES = ("primal", "grad", "jvp", "vjp", "all")

DESCRIPTION = """\
sowviz: see inside JAX programs.

commands:
  demo    inspect the built-in example (a small MLP whose gradients vanish
          in early layers and turn NaN at one stage) and write an offline,
          self-contained HTML report you can open in any browser.
  report  write the offline HTML report of a Monitor's run log (the
          `log_dir` of `sowviz.Monitor(..., log_dir=...)`): the whole run,
          thinned to a bounded size, from step 0 on. Several LOG_DIRs are one
          run resumed from checkpoints (`report runs/exp1 runs/exp1-resumed`).
"""


def _demo(args: argparse.Namespace) -> int:
    import sowviz

    from . import demo

    params, x = demo.init(), demo.batch()
    ins = sowviz.inspect(demo.loss, params, x, mode=args.mode, title="sowviz demo: a small MLP")
    try:
        path = ins.save_html(args.output)
    except OSError as err:  # a missing directory, a directory, no permission: one line
        return _failed("demo", err)
    size = pathlib.Path(path).stat().st_size
    print(f"wrote {pathlib.Path(path).resolve()} ({size / 1e6:.2f} MB): open it in a browser")
    return 0


def _report(args: argparse.Namespace) -> int:
    import warnings

    from .runlog import LogWarning, load

    log_dirs = [pathlib.Path(d) for d in args.log_dir]
    for log_dir in log_dirs:
        if not log_dir.is_dir():
            print(
                f"sowviz report: {log_dir} is not a directory (a Monitor's `log_dir`)",
                file=sys.stderr,
            )
            return 2
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LogWarning)
        try:
            view = load(*log_dirs, history=args.history)
        except ValueError as err:  # logs that do not join into one run: one line
            print(f"sowviz report: {str(err).removeprefix('sowviz.load: ')}", file=sys.stderr)
            return 2
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    try:
        path = view.save_html(args.output, title=args.title)
    except OSError as err:  # no model in the log, or the report's path is unwritable
        return _failed("report", err)
    size = path.stat().st_size
    kept = len(view.history)
    state = "finished" if view.finished else "still open (or the writer died)"
    print(
        f"wrote {path.resolve()} ({size / 1e6:.2f} MB): {_steps(view.steps_read)} read, "
        f"{kept} kept; the log is {state}"
    )
    for r in view.replaced:  # a run resumed from before its log's last step
        print(f"note: {r.message}")
    return 0


def _failed(command: str, err: OSError) -> int:
    """Say why `command` failed in one line (sowviz's messages name the path and the
    fix), not a traceback; the exit status of a usage error."""
    print(f"sowviz {command}: {str(err).removeprefix('sowviz: ')}", file=sys.stderr)
    return 2


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


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
    report = sub.add_parser("report", help="write the HTML report of a Monitor's run log")
    report.add_argument(
        "log_dir",
        metavar="LOG_DIR",
        nargs="+",
        help="the Monitor's `log_dir`; several: one run resumed from checkpoints (its "
        "logs in step order, joined into one history)",
    )
    report.add_argument(
        "-o", "--output", default="report.html", help="report path (default: report.html)"
    )
    report.add_argument(
        "--history",
        type=int,
        # (as many as a Monitor keeps: 1,000 made a 28 MB report of a 3,000-step run and
        # took 363 MB more to write it; 200, 7.7 MB and 55 MB)
        default=200,
        help="steps kept in the report, thinned over the whole run (default: 200)",
    )
    report.add_argument("--title", default=None, help="report title (default: the model's)")
    report.set_defaults(run=_report)
    args = parser.parse_args(argv)
    if args.command is None:  # a usage error, as argparse's own
        parser.print_help(sys.stderr)
        return 2
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
