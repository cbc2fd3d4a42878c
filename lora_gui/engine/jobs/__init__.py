"""The dashboard's runs as processes of their own, one on the card at a time: the job manager
(``manager.py``), the launcher that starts and follows a run's process (``launch.py``), the
guard that keeps one run on the card per runs folder (``card_guard.py``), and the queue of runs
waiting for the card: its file (``queue_file.py``), its runner (``queue_runner.py``) and its
``queue`` command (``queue_cli.py``)."""
