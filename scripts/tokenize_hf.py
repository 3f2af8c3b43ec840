#!/usr/bin/python3
"""`attnlog-tokenize-hf` from the checkout, without installing the package: /usr/bin/python3 scripts/tokenize_hf.py -h"""
import sys

from attnlog.tokenize_hf import main

if __name__ == "__main__":
    sys.exit(main())
