"""Control loops of the extender process: executors of pure decisions (one active instance)."""
