"""Aggregation maths: averaging, robust rules, server optimizers, update validation."""
