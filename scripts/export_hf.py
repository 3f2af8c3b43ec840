#!/usr/bin/python3
"""`attnlog-export-hf` from the checkout, without installing the package: /usr/bin/python3 scripts/export_hf.py -h"""
import sys

from attnlog.export_hf import main

if __name__ == "__main__":
    sys.exit(main())
