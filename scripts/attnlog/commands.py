"""What every command of the package does with an error (attnlog, attnlog-report, attnlog-probe,
attnlog-export-hf, and scripts/bench.py): a user error, that is a bad option, an input the command
cannot use (a damaged log, a missing checkpoint, ...) or an output it cannot write, prints one line
`error: ...` on stderr, naming the file or option, and ends the command with status USER_ERROR, 1,
as ./train does. No traceback: a traceback is a bug of the command.

    def main(argv=None):
        parser = commands.ArgumentParser(description="...")
        ...
        return commands.run(body, parser.parse_args, argv)
"""
import argparse
import os
import re
import sys

USER_ERROR = 1  # the exit status of every user error
INTERRUPTED = 130  # Ctrl-C, as ./train's
LINE_BREAKS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")  # what could break a one-line message
# The default corpus, which ./train prepares in data/brown of the checkout (the checkout these
# modules are in, run from it or installed with pip install -e): the commands' default data.
DEFAULT_DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                            "data", "brown")


class UserError(Exception):
    """An option, input or output the command cannot use; str(error) is one line naming it."""

    def __init__(self, message):
        super().__init__(one_line(message))


def one_line(text):
    """text with what would break it into lines (a name in a log's header may hold anything) escaped."""
    return LINE_BREAKS.sub(lambda m: repr(m.group())[1:-1], str(text))


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose usage errors are UserErrors: one line and status USER_ERROR, as every
    other error, instead of the usage text and status 2. Its subcommands' parsers are of this class too."""

    def error(self, message):
        raise UserError(f"{message} (see {self.prog} -h)")


def positive_int(text):
    """An option's whole number >= 1 (for argparse's type=)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return int(text)


def run(body, parse, argv=None):
    """The exit status of a command: body(parse(argv)) parses the command line and does the work;
    its status is what body returns (None: 0). A UserError, or an OSError, which can only be an
    output the command could not write (the package's readers turn every failure to read into a
    UserError naming the file), becomes one line `error: ...` on stderr and USER_ERROR. When the
    reader of the output stops reading (`| head`), the command stops quietly with USER_ERROR: what
    it printed was cut short. Ctrl-C stops it with INTERRUPTED."""
    try:
        return body(parse(argv)) or 0
    except UserError as e:
        message = str(e)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return USER_ERROR
    except OSError as e:
        message = f"{e.filename if e.filename is not None else 'the output'}: cannot write ({e.strerror or e})"
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return INTERRUPTED
    print(one_line(f"error: {message}"), file=sys.stderr)
    return USER_ERROR
