"""The ``wirehead-torch`` command: manager, status, clean, monitor, demo, and
the batch-job entry points generate, export and train."""
import argparse
import json
import logging
import math
import os
import sys
import threading
import time
import warnings

from .. import _C
from .._store import gen_label
from ..config import DEFAULT_CONFIG_PATH
from . import jobs
from ._args import MAX_INTERVAL, Parser, integer, number, seconds
from .monitor import closed_pipe_exit, human_time


def _cmd_manager(args):
    from ..manager import SUMMARY_EVERY, WireheadManager
    # --quiet keeps the start and end lines (quiet=True would print none)
    m = WireheadManager(config_path=args.config, json_lines=args.json, out=sys.stdout,
                        summary_every=None if args.quiet else SUMMARY_EVERY,
                        verbose=args.verbose)
    if args.seconds is not None:
        # a batch job's manager ends by itself, as a SIGTERM would end it
        t = threading.Timer(args.seconds, m.stop, (f"--seconds {args.seconds:g}",))
        t.daemon = True
        t.start()
    m.run(max_swaps=args.max_swaps)  # its end line says what it sealed and saw sealed
    return 0


def _fmt_status(st, now=None):
    now = time.time() if now is None else now
    lines = [
        f"store            {st['store']}",
        "read generation  " + (gen_label(st['read_gen'], st) if st['read_gen'] else "none yet"),
        f"write generation {gen_label(st['write_gen'], st)} "
        f"({st['write_fill']}/{st['swap_cap']} samples"
        + (f", {st['write_bytes'] / 2**20:.1f} of {st['byte_budget'] / 2**20:.1f} MiB)"
           if st["byte_budget"] else ")"),
        f"generated        {st['generated']} accepted, {st['discarded']} surplus discarded, "
        f"{st['seals']} swaps",
        "generators       " + _fmt_generators(st.get("last_put") or 0, now),
        "manager          " + (f"pid {st['leader_pid']} (lease {st['lease_left_s']:.1f}s left)"
                               if st['leader_pid']
                               else "none running (no process holds the lease)"),
        "rate             " + (f"{st['samples_per_s']:.1f} samples/s (since the oldest swap "
                               f"listed below)"
                               if st['samples_per_s'] is not None else "-"),
        "params           " + _fmt_params(st),
    ]
    if st.get("spec") is not None:
        lines += _fmt_spec(st["spec"], st["swap_cap"])
    loc = st.get("local_cache")
    if loc:
        lines += _fmt_local(loc, st)
    from ..manager import stall_text
    stall = stall_text(st)  # readers' views pin every area a seal could take
    if stall:
        lines.append(f"sealing          {stall}")
    readers = st.get("readers") or []
    lines.append(f"readers          {len(readers) or 'none reading'}"
                 + (f"; each sample of the read generation served "
                    f"{st.get('reuse_per_sample', 0):.1f} times so far"
                    " (per reader: pid, generation read, reads of it / SWAP_CAP = reuse, "
                    "samples/s)" if readers else ""))
    for r in readers:
        where = f"{r['host']}:" if r["host"] else ""
        lines.append(f"  {where}{r['pid']:<8} {gen_label(r['generation'], st):>8}  "
                     f"reuse {r['reuse']:.1f}  {r['samples_per_s']:.1f} samples/s  "
                     f"(seen {r['age_s']:.0f} s ago)")
    if st["history"]:
        lines.append("last swaps:")
        for h in st["history"]:
            lines.append(f"  {human_time(h['time'], now)}  "
                         f"generation {gen_label(h['generation'], st)} generated={h['generated']} "
                         f"discarded={h['discarded']} seal={h['seal_s'] * 1e3:.3f}ms")
    return "\n".join(lines)


def _fmt_spec(sp, cap):
    """Spec mode's lines of `status` (docs/reproducible.md, "Status")."""
    if not sp["spec"]:
        return ["spec mode        RUN_SEED in the config, but the store is not in spec mode"]
    lines = [f"spec mode        RUN_SEED {sp['run_seed']}; sealed "
             + (f"up to spec generation #{sp['last_sealed']}" if sp["any_sealed"]
                else "none yet")
             + (f"; making #{sp['open_gen']} ({sp['open_fill']}/{cap})" if sp["open"] else
                "; none being made"),
             "  slowest reader " + (f"needs #{sp['slowest']} (pid {sp['slowest_pid']})"
                                    if sp["reader"] else
                                    f"none reading (kept from #{sp['floor']})"),
             f"  puts           {sp['duplicates']} made twice, {sp['nondeterministic']} of "
             f"them with other bytes (a nondeterministic fn)",
             "  numbering      spec generations count from #0 (sample k is in #k // SWAP_CAP); "
             "the generation lines above count the store's seals"]
    for c in sp["claims"]:
        lines.append(f"  claimed        index {c['index']} by {c['host'] or '?'}:{c['pid']} "
                     f"(attempt {c['attempt']}, renewed {c['age_s']:.1f} s ago)")
    if sp["failed"]:
        lines.append(f"  FAILED         {sp['failure']}")
    return lines


# Past a minute without a put, status says none is putting (a slow
# generator makes a sample every few seconds).
GENERATOR_IDLE_S = 60


def _fmt_generators(last_put, now):
    if not last_put:
        return "none has put a sample yet"
    when = f"last put {human_time(last_put, now)}"
    if now - last_put <= GENERATOR_IDLE_S:
        return when
    return f"none in the last {GENERATOR_IDLE_S} s: {when}"


def _fmt_local(loc, st):
    """The node-local tier's lines of `status` (LOCAL_CACHE set)."""
    out = [f"local cache      {loc['store']} (this node: {loc['node']})",
           "  read gen.      " + (gen_label(loc["read_gen"], st) if loc["read_gen"]
                                  else "none yet")
           + f", {loc['lag_generations']} behind MongoDB's newest, "
           f"{len(loc['readers'])} reader process(es) on this node"]
    if loc.get("foreign"):
        # the copy's relay and readers serve another store: this config's refuse it
        what = (f"the copy of {loc['source']}" if loc["source"] else
                "no source recorded (a plain shm store, no relay's copy)")
        # this config's clean refuses it: a plain store is another config's data
        fix = (", or remove the copy once nothing uses it (wirehead-torch clean --local-only "
               "with a config of that store)" if loc["source"] else "")
        out.append(f"  source         {what}, NOT of this config's {loc['config_source']}: "
                   f"its readers and relay refuse it; give LOCAL_CACHE another name (or "
                   f"auto){fix}")
    elif loc.get("source"):
        out.append(f"  source         {loc['source']}")
    r = loc.get("relay")
    if not r:
        out.append("  relay          none has run on this node: start wirehead-torch relay "
                   "--config FILE")
        return out
    state = f"pid {r['pid']}" + ("" if r["running"] else " (not running)")
    mean = r["pull_s_total"] / r["generations"] if r["generations"] else None
    out.append(f"  relay          {state}: {r['generations']} generations mirrored, "
               f"{r['bytes'] / 2**20:.2f} MiB pulled from MongoDB"
               + (f", last pull {r['last_pull_s']:.3f}s, mean {mean:.3f}s" if mean else ""))
    if r["running"] and r.get("last_error"):
        out.append(f"  relay error    {r['last_error']} (retrying)")
    return out


def _fmt_params(st):
    """The params version and how much of the read generation it made."""
    v = st.get("params_version", 0)
    if not v:
        return "never set"
    rp = st.get("read_params")
    if not rp or not rp["samples"]:
        return f"version {v}"
    span = f"{rp['min']}" if rp["min"] == rp["max"] else f"{rp['min']}..{rp['max']}"
    return (f"version {v}; the read generation: {rp['at_current']}/{rp['samples']} samples "
            f"made under it (versions {span})")


def _cmd_params(args):
    from ..params import MAX_PARAMS_DEPTH, get_params, set_params
    if args.set:
        _, params = get_params(config_path=args.config)
        for item in args.set:
            key, sep, text = item.partition("=")
            if not sep or not key:
                raise ValueError(f"--set {item!r}: give KEY=JSON (e.g. --set noise=0.2)")
            def no_constant(name, key=key):  # NaN and Infinity are not JSON
                raise ValueError(f"--set {key}: {name} is not a JSON value; give a number")

            def finite(digits, key=key):  # 1e999 would be inf, which JSON cannot carry
                x = float(digits)
                if not math.isfinite(x):
                    raise ValueError(f"--set {key}: {digits} is not representable (inf and "
                                     f"nan are not JSON); give a finite number")
                return x
            try:
                params[key] = json.loads(text, parse_constant=no_constant, parse_float=finite)
            except json.JSONDecodeError as e:
                raise ValueError(f"--set {key}: {text!r} is not JSON ({e}); a string is "
                                 f"quoted: --set {key}='\"text\"'") from None
            except RecursionError:
                raise ValueError(f"--set {key}: nested too deep (at most "
                                 f"{MAX_PARAMS_DEPTH} levels)") from None
            except ValueError as e:  # an int of more digits than Python converts
                if str(e).startswith("--set "):
                    raise
                raise ValueError(f"--set {key}: {e}") from None
        try:
            set_params(params, config_path=args.config)
        except TypeError as e:  # what set_params refuses, in one line
            raise ValueError(str(e)) from None
    version, params = get_params(config_path=args.config)
    if args.json:
        print(json.dumps({"version": version, "params": params}))
    else:
        print(f"version {version}" + ("" if version else " (never set)"))
        for k in sorted(params):
            print(f"  {k} = {json.dumps(params[k])}")
    return 0


def _cmd_status(args):
    from ..admin import status
    if not args.watch:
        st = status(config_path=args.config)
        print(json.dumps(st) if args.json else _fmt_status(st))
        return 0
    # --watch: the figures every --interval seconds, redrawn on a terminal
    n, clear = 0, sys.stdout.isatty() and not args.json
    try:
        while args.count is None or n < args.count:
            if n:
                time.sleep(2.0 if args.interval is None else args.interval)
            try:
                st = status(config_path=args.config)
                text = json.dumps(st) if args.json else _fmt_status(st)
            except _C.NotFoundError as e:  # removed (clean) or not made yet: keep watching
                text = json.dumps({"error": str(e)}) if args.json else f"no store yet: {e}"
            print(("\x1b[H\x1b[2J" if clear else "") + text, flush=True)
            n += 1
    except KeyboardInterrupt:
        pass
    return 0


def _cmd_relay(args):
    from ..relay import WireheadRelay
    with WireheadRelay(config_path=args.config, wait=not args.no_wait,
                       quiet=args.quiet, verbose=args.verbose) as r:  # logs to stderr
        r.run(max_generations=args.max_generations)
    return 0


def _cmd_clean(args):
    from .._redact import redact
    from .._store_args import local_cache_uri
    from ..admin import clean
    from ..config import get_store_config
    cfg, _ = get_store_config(args.config)
    if args.local_only:
        what = f"this node's copy {local_cache_uri(cfg) if cfg['LOCAL_CACHE'] else ''}"
    else:
        what = f"store {redact(cfg['STORE'])}"
        if cfg["LOCAL_CACHE"]:  # clean removes this node's copy with it
            what += f" and this node's copy {local_cache_uri(cfg)}"
    if clean(config_path=args.config, local_only=args.local_only):
        print(f"removed {what}")
    else:
        print(f"nothing to remove: no {what}")
    if args.local_only:
        return 0
    from .._ring import remove_dead
    # DataLoader batch rings are per process, not per store: a killed
    # rank's are left in /dev/shm until a later ring, or this, removes them
    n = remove_dead()
    if n:
        print(f"removed {n} ring file(s) of DataLoader processes that are gone")
    return 0


def _config_arg(parser):
    parser.add_argument("--config", default=None,
                        help=f"the store's config file (default: {DEFAULT_CONFIG_PATH})")


def _default_config(args):
    """--config left out: config.yaml of the working directory, as the API
    reads it; when that is missing, say where it looked."""
    if getattr(args, "config", "") is not None:
        return
    if not os.path.isfile(DEFAULT_CONFIG_PATH):
        raise ValueError(f"no {DEFAULT_CONFIG_PATH} in {os.getcwd()} (the default --config); "
                         f"pass --config PATH")
    args.config = DEFAULT_CONFIG_PATH


class _Version(argparse.Action):
    """--version: this package's version and which `wirehead` package the
    environment imports (the migration question users ask first)."""

    def __init__(self, option_strings, dest, **kw):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        from .. import __version__
        from .monitor import wirehead_package
        print(f"wirehead-torch {__version__}\n{wirehead_package()}")
        sys.stdout.flush()  # a closed pipe raises here, inside main's handler
        parser.exit()


def _cmd_demo(args, rest):
    from . import demo
    return demo.main(rest)


def _plain_warning(message, category, filename, lineno, file=None, line=None):
    """A warning as the command's own line: the file and line inside the
    package mean nothing to someone at a shell."""
    print(f"wirehead-torch: warning: {message}", file=file or sys.stderr, flush=True)


def main(argv=None):
    with warnings.catch_warnings():
        warnings.showwarning = _plain_warning
        return _main(argv)


def _main(argv):
    argv = list(sys.argv[1:] if argv is None else argv)
    p = Parser(prog="wirehead-torch", description=__doc__)
    p.add_argument("--version", action=_Version, help="print the version and exit")
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("manager", help="seal generations (one manager leads at a time)")
    _config_arg(m)
    m.add_argument("--json", action="store_true",
                   help="one JSON object per swap on stdout (start and end lines on stderr)")
    m.add_argument("--max-swaps", type=integer(1), default=None, metavar="N",
                   help="stop after sealing N generations")
    m.add_argument("--seconds", type=seconds(), default=None, metavar="T",
                   help="stop after this long (below 10^6)")
    loud = m.add_mutually_exclusive_group()
    loud.add_argument("--quiet", action="store_true",
                      help="no summary lines (the start and end lines and warnings stay)")
    loud.add_argument("--verbose", action="store_true", help="also a line per swap")
    s = sub.add_parser("status", help="current generation, write fill, swaps, rates")
    _config_arg(s)
    s.add_argument("--json", action="store_true",
                   help="one JSON object: full generation ids, every figure")
    s.add_argument("--watch", action="store_true", help="print the figures every --interval s")
    s.add_argument("--interval", type=number(0, MAX_INTERVAL, "a number of seconds"),
                   default=None, metavar="S",
                   help=f"with --watch: seconds between prints (default 2, at most "
                        f"{MAX_INTERVAL:g})")
    s.add_argument("--count", type=integer(1), default=None, metavar="N",
                   help="with --watch: stop after N prints")
    r = sub.add_parser("relay", help="copy each MongoDB generation once into this node's "
                       "LOCAL_CACHE store (one per node; docs/relay.md)")
    _config_arg(r)
    r.add_argument("--max-generations", type=integer(1), default=None, metavar="N",
                   help="stop after copying this many generations")
    r.add_argument("--no-wait", action="store_true",
                   help="exit if another relay fills this node's store (default: wait)")
    loud = r.add_mutually_exclusive_group()
    loud.add_argument("--quiet", action="store_true",
                      help="no summary lines (the start line and warnings stay)")
    loud.add_argument("--verbose", action="store_true",
                      help="also a line per copied generation")
    c = sub.add_parser("clean", help="remove this store's segments or collections")
    _config_arg(c)
    c.add_argument("--local-only", action="store_true",
                   help="remove only this node's LOCAL_CACHE copy (docs/relay.md)")
    pa = sub.add_parser("params", help="show or change the params generators read "
                        "(docs/params.md)")
    _config_arg(pa)
    pa.add_argument("--set", action="append", metavar="KEY=JSON", default=[],
                    help="set KEY to a JSON value (repeatable; one new version for all)")
    pa.add_argument("--json", action="store_true", help='{"version": V, "params": {...}}')
    jobs.parser(sub)
    sub.add_parser("demo", help="generators + manager + training on the embedded store",
                   add_help=False)
    sub.add_parser("monitor", help="swap history, --daemon snapshots, --tui dashboard "
                   "(the original wirehead's `wirehead` command)", add_help=False)
    try:
        if argv and argv[0] == "demo":
            return _cmd_demo(None, argv[1:])
        if argv and argv[0] == "monitor":
            from .monitor import main as monitor_main
            return monitor_main(argv[1:], prog="wirehead-torch monitor", missing_ok=False)
        args = p.parse_args(argv)
        if args.cmd == "status" and not args.watch:
            for flag, given in (("--interval", args.interval), ("--count", args.count)):
                if given is not None:
                    s.error(f"{flag} paces --watch; add --watch")
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
        try:
            if args.cmd in ("generate", "train", "export"):
                return jobs.run(args, argv)
            _default_config(args)
            cmd = {"manager": _cmd_manager, "status": _cmd_status, "clean": _cmd_clean,
                   "relay": _cmd_relay, "params": _cmd_params}[args.cmd]
            rc = cmd(args)
            sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
            return rc
        except (ValueError, _C.WireheadError, TimeoutError, RuntimeError) as e:
            print(f"wirehead-torch {args.cmd}: {e}", file=sys.stderr)
            return 2
    except BrokenPipeError:
        return closed_pipe_exit()


if __name__ == "__main__":
    sys.exit(main())
