"""The command line: every command's handler (main)."""
