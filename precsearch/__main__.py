import sys

from precsearch.cli import main
from precsearch.utils.processes import exit_now

code = main()
if code == 130:  # stopped by Ctrl-C: everything is closed and said; skip the interpreter's slow teardown
    exit_now(code)
sys.exit(code)
