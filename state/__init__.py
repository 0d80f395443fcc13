"""linstream.state: the per-sequence state value, its Arrow codec and the checkpoint store."""
