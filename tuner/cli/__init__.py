"""The command line: every command's handler (main)."""

# The exit code of `tuner tune` and `tuner sweep` when the search ran and passed no config:
# nothing a script may build on, and not bad input (2) or a run that could not go on (1).
NO_WINNER = 3
