"""Former module path of the hardconcrete family, kept so that imports and pickled models that name it still
resolve; the code lives in ``dualdrop.nn.methods.hardconcrete`` (``method`` and ``fused``)."""

from dualdrop.nn.methods.hardconcrete import method as _moved

globals().update({k: v for k, v in vars(_moved).items() if not k.startswith("__")})
