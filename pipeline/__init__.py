"""linstream.pipeline: Beam transforms, the stateful DoFn, I/O and the `linstream` command."""
