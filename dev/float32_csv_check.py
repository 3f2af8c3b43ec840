"""Checks that every finite float32, written as the export writes it (numpy's shortest decimal that
reads back as the same float32), comes back from pandas.read_csv's defaults, cast to float32, as
the same float32. The test suite checks 300,000 random ones and the edges; this checks them all.

    /usr/bin/python3 dev/float32_csv_check.py      # about 25 minutes on 2 cores

Why it is enough to look near the midpoints between float32s: the text is a decimal s of at most 9
significant digits, and pandas' default parser (1.5) turns it into a double within 2^-52 of s
(the digits, at most 17, are read exactly; one multiplication or division by the double nearest
10^E rounds once, or twice when 10^E is not a double). The cast to float32 then gives the float32
nearest s unless a midpoint between two float32s lies between s and that double, that is within
2^-52 of s. So every midpoint (2^32 of them, normal and subnormal) is tested for a decimal of 10
significant digits (a grid that holds every 9-digit decimal) within 2^-45 of it; the float32s
beside each midpoint that has one are then written and read back by pandas itself. A decimal
equal to a midpoint needs no check: its exponent is small enough that the parser reads it exactly,
and both roundings then send the tie to the even float32.
"""
import io
import sys

import numpy as np
import pandas

NEAR = 2.0 ** -45  # far wider than the parser's 2^-52, and than the 2^-51 by which the float64 screening below can err


def near_midpoints(exponent):
    """The midpoints of one binade of float32s (exponent -127: the subnormals) that have a
    10-digit decimal within NEAR of them but not on them, as float64 (exact: 25 bits)."""
    j = np.arange(2**23, dtype=np.int64)
    odd, power = (2 * j + 1, -150) if exponent == -127 else (2**24 + 2 * j + 1, exponent - 24)
    midpoint = odd.astype(np.float64) * 2.0 ** power  # odd * 2^power
    E = np.floor(np.log10(midpoint)).astype(np.int64) - 9  # 10 digits; 9 or 11 when log10 rounds across a power
    scaled = midpoint / 10.0 ** E  # within ~2e-6 of its exact value, against a threshold of ~1e-4 and more
    near = np.abs(scaled - np.rint(scaled)) < NEAR * scaled
    # midpoint = S 10^E exactly: 2^E and 5^E divide odd 2^power (5^11 is more than any odd here).
    on = np.where(E >= 0, (power >= E) & (E <= 10) & (odd % 5 ** np.clip(E, 0, 10) == 0), power - E >= 0)
    return midpoint[near & ~on]


def read_back_wrong(values):
    """The float32 values that pandas.read_csv's defaults, cast to float32, do not give back."""
    texts = values.astype(str)  # what the export writes (attnlog.reader._text)
    back = pandas.read_csv(io.StringIO("v\n" + "\n".join(texts) + "\n")).v.to_numpy().astype(np.float32)
    return values[back != values]


def main():
    midpoints = np.concatenate([near_midpoints(e) for e in range(-127, 128)])
    nearest = midpoints.astype(np.float32)  # one of the two float32s beside each midpoint
    beside = np.concatenate([np.nextafter(nearest, np.float32(0)), nearest, np.nextafter(nearest, np.float32(np.inf))])
    values = np.unique(beside[np.isfinite(beside) & (beside > 0)])
    values = np.concatenate([values, -values])
    wrong = read_back_wrong(values)
    print(f"{len(midpoints)} midpoints with a decimal near them; {len(values)} float32s beside them read back "
          f"by pandas {pandas.__version__}: {len(wrong)} wrong {wrong[:10].tolist()}")
    return 1 if len(wrong) else 0


if __name__ == "__main__":
    sys.exit(main())
