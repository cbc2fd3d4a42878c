"""Byte units, one definition for every module. Budgets are typed in decimal GB (as the
``budget_gb`` setting and ``--budget-gb`` say), figures are shown in binary MiB / GiB."""

GB = 1e9  # bytes in a decimal gigabyte (budget_gb, --budget-gb)
MIB = 2**20  # bytes in a mebibyte
GIB = 2**30  # bytes in a gibibyte
