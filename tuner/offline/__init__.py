"""Search strategies compared offline on recorded landscapes (replay)."""
