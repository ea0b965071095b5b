import sys

from .doctor import main

sys.exit(main(sys.argv[1:]))
