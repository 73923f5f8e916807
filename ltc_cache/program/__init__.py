"""Layer 3, whole programs: `ltc_cache.compile`, built on `compile_backend`.

`precompile` captures a function once through Dynamo and stores it as a
signed program entry (`entries`); a warm process loads it with no Dynamo
capture. `frames` and `frame_names` keep a function Dynamo splits into
several frames as one program; `compiled_module` is the module stand-in
`ltc_cache.compile(module)` returns.
"""
