"""The figures pages in docs/results/ and the README's figures at a glance, made from the
results in bench/results/ (``python -m bench.docs``; ``--check`` in ``make test``)."""
