"""Runtime of every command: the runner, the world (torchrun ranks), resume, signals, sessions, the pipeline and the request base."""
