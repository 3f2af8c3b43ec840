"""Comparisons with a tolerance for the Python tests, as test/testing.h's check_close: each records
which fraction of its tolerance it used, and test/conftest.py prints one line per check (per place
in a test file) at the end of the run, "... uses 37% of its tolerance", so that

    grep -E 'uses ([5-9][0-9]|[0-9]{3,}|inf)% of its tolerance'

finds the checks that came past half of theirs, C++ and Python alike.

    assert_close(got, want, rtol=1e-6, atol=0.0)     element-wise |got - want| <= atol + rtol |want|
    assert x == close(want, rtol=1e-6)               the same inside an expression (as pytest.approx)
    assert_norm_close(got, want, rtol=1e-6)          ||got - want|| <= rtol ||want||, in norm
    assert_within(value, limit)                      any measure of error against its limit
"""
import inspect
import math
import os

import numpy as np

# "file:line" of the check -> [number of evaluations, the largest fraction used, its description]
RECORDS = {}


def _site(depth):
    frame = inspect.stack()[depth]
    return f"{os.path.relpath(frame.filename)}:{frame.lineno}"


def _record(site, used, detail):
    entry = RECORDS.setdefault(site, [0, -1.0, ""])
    entry[0] += 1
    if not used <= entry[1]:  # NaN too
        entry[1], entry[2] = used, detail


def tolerance_used(fraction):
    """'uses 37% of its tolerance', as check_close prints it."""
    if not fraction >= 0 or math.isinf(fraction):
        return "uses inf% of its tolerance"
    return f"uses {100 * fraction:.1f}% of its tolerance" if fraction < 0.1 else f"uses {100 * fraction:.0f}% of its tolerance"


def _measure(got, want, rtol, atol):
    """(fraction used, passed, description) of an element-wise comparison."""
    g = np.asarray(got, dtype=np.float64)
    w = np.asarray(want, dtype=np.float64)
    g, w = np.broadcast_arrays(g, w)
    if g.size == 0:
        return math.inf, False, "no values to compare"
    err = np.abs(g - w)
    allowed = atol + rtol * np.abs(w)
    with np.errstate(divide="ignore", invalid="ignore"):
        used = np.where(err == 0, 0.0, np.where(allowed > 0, err / allowed, np.inf))
    used = np.where(np.isnan(used), np.inf, used)
    worst = int(np.argmax(used))
    fraction = float(used.flat[worst])
    beyond = int(np.count_nonzero(~(err <= allowed)))
    detail = (f"{tolerance_used(fraction)}; n={g.size} max abs err {float(np.max(err)):.3g} (rtol {rtol:.3g}, atol "
              f"{atol:.3g}); closest to its limit [{worst}]: got {g.flat[worst]:.9g} want {w.flat[worst]:.9g}; "
              f"{beyond} beyond")
    return fraction, beyond == 0 and bool(np.all(np.isfinite(g))), detail


def assert_close(got, want, rtol=0.0, atol=0.0, what=""):
    """Element-wise |got - want| <= atol + rtol |want| (numbers or arrays, broadcast)."""
    used, ok, detail = _measure(got, want, rtol, atol)
    site = _site(2)
    _record(f"{site} {what}".rstrip(), used, detail)
    assert ok, f"{what or site}: {detail}"


def assert_norm_close(got, want, rtol, what=""):
    """||got - want|| <= rtol ||want|| (the 2-norm over every element)."""
    g, w = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    diff, scale = float(np.linalg.norm(g - w)), float(np.linalg.norm(w))
    assert_within(diff, rtol * scale, what, f"||got - want|| {diff:.3g}, {diff / scale if scale else math.inf:.3g} of ||want||",
                  depth=3)


def assert_within(value, limit, what="", detail="", depth=2):
    """A measure of error against its limit: value <= limit."""
    used = 0.0 if value == 0 else value / limit if limit > 0 else math.inf
    text = f"{tolerance_used(used)} ({value:.3g} of {limit:.3g}){'; ' + detail if detail else ''}"
    _record(f"{_site(depth)} {what}".rstrip(), used, text)
    assert value <= limit, f"{what}: {text}"


class close:
    """`got == close(want, rtol, atol)`: element-wise |got - want| <= atol + rtol |want|, usable inside
    an expression, a tuple, a list or a dict, as pytest.approx; records its margin as assert_close."""
    __array_ufunc__ = None  # numpy hands the comparison to __eq__ below
    __array_priority__ = 100

    def __init__(self, want, rtol=0.0, atol=0.0):
        self.want, self.rtol, self.atol = want, rtol, atol
        self.site = _site(2)
        self.detail = "not compared"

    def __eq__(self, got):
        try:
            used, ok, self.detail = _measure(got, self.want, self.rtol, self.atol)
        except (TypeError, ValueError):
            return False
        if np.shape(got) != np.shape(self.want) and np.ndim(self.want) > 0:
            return False
        _record(self.site, used, self.detail)
        return ok

    def __ne__(self, got):
        return not self.__eq__(got)

    __hash__ = None

    def __repr__(self):
        return f"close({self.want!r}, rtol={self.rtol}, atol={self.atol}: {self.detail})"
