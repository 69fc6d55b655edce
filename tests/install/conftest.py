import collections
import re


def pytest_terminal_summary(terminalreporter):
    """Counts the documentation's blocks that test_docs.py checked but did
    not run, by the reason their marker gives, so a run says how much of
    the documentation it did not execute."""
    reasons = collections.Counter()
    for report in terminalreporter.stats.get("passed", []):
        m = re.search(r"test_unrun_block_names_what_exists\[.*-not-run=([\w-]+)\]$",
                      report.nodeid)
        if m and report.when == "call":
            reasons[m.group(1)] += 1
    if reasons:
        terminalreporter.write_line(
            f"docs blocks not run: {sum(reasons.values())} ("
            + ", ".join(f"{k} {n}" for k, n in sorted(reasons.items()))
            + "; each checked for the targets, commands and paths it names; "
              "reasons: tests/install/test_docs.py NOT_RUN)")
