"""What every process agrees on: the frozen ServerConfig, the messages and their codec, the IPC
sockets, the errors, SamplingParams and its validation, stop rules. Imports no torch and nothing
of ours outside this package, so any process (or a test) can load it in milliseconds."""
