"""pipeplan profiles: the profiler (torch) and the profile data model (pure Python)."""
