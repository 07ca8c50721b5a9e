"""The kinds of corpus `nmt prepare` reads, one module each, registered by name (registry.py looks them up)."""
