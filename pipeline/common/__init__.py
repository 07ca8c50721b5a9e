"""Shared by every stage: user errors, storage paths and URIs, the Ray connection, checkpoints, logging."""
