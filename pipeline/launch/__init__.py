"""Starting the pipeline: `nmt submit` (Ray Jobs on a cluster) and `nmt demo` (everything, locally)."""
