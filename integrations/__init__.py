"""Glue for training frameworks; imports only zephon_torch's public API."""
