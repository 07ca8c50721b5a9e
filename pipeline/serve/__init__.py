"""Using a registered model: `nmt translate` / `nmt evaluate`, the packaged pyfunc, the Ray Serve service."""
