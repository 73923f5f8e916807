"""Layer 3, whole programs: `ltc_cache.compile`, built on `compile_backend`.

`precompile` is `compile()`; `programs` keeps the programs of one function
and captures one through Dynamo (`capture`, `program_graph`) or loads it
(`loaded`) from a signed program entry (`entries`; its key: `ltc_cache.signing`), so a warm
process runs with no Dynamo capture. The guards Dynamo cannot save become
checks (`guards`, `checks`, `check_exprs`) of objects described across
processes (`describe`). `frames`, `frame_package` and `frame_names` keep a
function Dynamo splits into several frames as one program;
`compiled_module` is the module stand-in `ltc_cache.compile(module)` returns;
`data_parallel` that of a DistributedDataParallel, whose module is compiled.
"""
