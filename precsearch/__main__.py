import sys

from precsearch.cli import main

sys.exit(main())
