"""Model builders for the tests and the tools: small models built from
configs written here (``transformers`` classes with tiny configs, plain
``torch.nn`` modules, FX corner cases), with random weights from fixed
seeds and their example inputs. Nothing is downloaded. Not part of the
installed package: the repository's tests and tools import it from the
repository root."""
