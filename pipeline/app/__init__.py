"""The application: the `linstream` command and the embed job built from the stage and the I/O.

cli             the command line: sample, embed, demo, checkpoint ...
options         EmbedConfig, the embed job's options parsed once; its fields are the flags
                (one table, also a Beam PipelineOptions view)
flag_values     how a flag's text becomes a value (booleans, counts, the dead-letter limit)
job             build_embed_pipeline (what deploy launchers call) and run_embed
stopping        SIGINT/SIGTERM, worker processes, torn temporary folders
local_runner    the in-process runner's state cache
demo, sample    `linstream demo` and `linstream sample`
checkpoint_cli  `linstream checkpoint inspect|verify|gc`
"""
