import sys

from hacpo.cli import main

sys.exit(main())
