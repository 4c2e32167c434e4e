"""``python -m taskloss.runner …``: rerun and sweep notebooks (see :mod:`taskloss.runner.runs`)."""
import sys
import traceback

from taskloss.runner.runs import main

if __name__ == "__main__":  # pragma: no cover
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        traceback.print_exc()
        sys.exit(130)
