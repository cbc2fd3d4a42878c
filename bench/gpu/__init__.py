"""The GPU check: its plans made on a CPU, the run on a lent card, its report and the kit that
packs this project's libraries for the card."""
