#!/usr/bin/python3
"""`attnlog-probe` from the checkout, without installing the package: /usr/bin/python3 scripts/probe.py -h"""
import sys

from attnlog.probe import main

if __name__ == "__main__":
    sys.exit(main())
