#!/usr/bin/python3
"""`attnlog` from the checkout, without installing the package: /usr/bin/python3 scripts/attnlog.py -h"""
import sys

from attnlog.reader import main

if __name__ == "__main__":
    sys.exit(main())
