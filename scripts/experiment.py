#!/usr/bin/python3
"""The experiment kept in a folder of runs, from the checkout: /usr/bin/python3 scripts/experiment.py -h"""
import sys

from attnlog.experiment import main

if __name__ == "__main__":
    sys.exit(main())
