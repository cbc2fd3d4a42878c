"""``python -m lora_gui``: the command line (lora_gui/cli/), the same as the ``lora-gui`` command."""

import sys

from lora_gui.cli import main

if __name__ == "__main__":
    sys.exit(main())
