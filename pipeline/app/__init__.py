"""The application: the `linstream` command and the embed job built from the stage and the I/O.

cli             the command line: sample, embed, demo, warmup, checkpoint ...
cli_logging     what the command logs for 0, 1 or 2 -v; Beam's import-time lines kept quiet
options         EmbedConfig, the embed job's options parsed once; its fields are the flags
                (one table, also a Beam PipelineOptions view)
flag_values     how a flag's text becomes a value (booleans, counts, the dead-letter limit)
job             build_embed_pipeline (what deploy launchers call) and run_embed
second_run      what a job does with an output or checkpoint folder that is not empty
work_left       what a job has left to do (its progress line's 100%)
embed_api       the one-line API, embed() and Resumable (no Beam), over api_inputs (what it
                embeds: texts, files, folders, arrays, each a named sequence cut in chunks)
                and api_results (the Table it returns, its progress bar)
stopping        SIGINT/SIGTERM, worker processes, torn temporary folders
local_runner    the in-process runner's state cache
demo, sample    `linstream demo` and `linstream sample`
checkpoint_cli  `linstream checkpoint inspect|verify|gc`
"""
