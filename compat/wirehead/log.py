"""``wirehead.log`` of the original: swap logs, snapshots, the logger and
the ``wirehead`` command."""
from wirehead_torch.apps.monitor import SwapLog, WireheadLogger, WireheadSnapshot, main  # noqa: F401

if __name__ == "__main__":
    import sys
    sys.exit(main())
