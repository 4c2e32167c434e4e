"""``python -m taskloss.runner …``: rerun and sweep notebooks (see :mod:`taskloss.runner.cli`)."""
import sys

from taskloss.runner.cli import main

if __name__ == "__main__":  # pragma: no cover
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C before or after the sweep proper (run_many handles it during)
        print("interrupted", file=sys.stderr)
        sys.exit(130)
