import sys

from dualdrop.cli import main

sys.exit(main())
