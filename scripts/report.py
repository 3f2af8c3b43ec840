#!/usr/bin/python3
"""`attnlog-report` from the checkout, without installing the package: /usr/bin/python3 scripts/report.py -h"""
import sys

from attnlog.report import main

if __name__ == "__main__":
    sys.exit(main())
