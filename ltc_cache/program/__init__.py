"""Layer 3, whole programs: `ltc_cache.compile`, built on `compile_backend`.

`precompile` is `compile()`; `programs` keeps the programs of one function
and hands each new input layout to a route (`route`): `single_graph`
captures one graph through Dynamo (`capture`, `program_graph`) or loads it
(`loaded`) from a signed program entry (`entries`; its key:
`ltc_cache.signing`), so a warm process runs with no Dynamo capture; the
`frames` subpackage keeps a function Dynamo splits into several frames as
one program; `fallback` is `torch.compile(backend="ltc_cache")` for the
layouts no program serves. The guards Dynamo cannot save become checks
(`guards`, `checks`, `check_exprs`) of objects described across processes
(`describe`). `compiled_module` is the module stand-in
`ltc_cache.compile(module)` returns; `data_parallel` that of a
DistributedDataParallel, whose module is compiled.

Torch-private surfaces, one module each: `dynamo_package` (Dynamo's
precompile and package) and `guards` (Dynamo's guards); their pins are in
tests/common/test_torch_private.py.
"""
