"""The fleet runtime: broker, fleet, round loop, publishing, checkpoints, report."""
