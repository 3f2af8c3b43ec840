"""pytest's hooks for the tests of test/ and test/fuzz/: at the end of the run, one line per check
with a tolerance (test/tolerance.py) saying which fraction of its tolerance it used, the checks
closest to their limits first."""
import tolerance


def pytest_terminal_summary(terminalreporter):
    if not tolerance.RECORDS:
        return
    terminalreporter.section("tolerances used (test/tolerance.py)")
    for site, (count, _, detail) in sorted(tolerance.RECORDS.items(), key=lambda item: -item[1][1]):
        terminalreporter.write_line(f"{site} ({count} comparison{'s' if count > 1 else ''}): {detail}")
