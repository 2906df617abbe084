"""Former module path of the penalty family, kept so that imports and pickled models that name it still
resolve; the code lives in ``dualdrop.nn.methods.penalty`` (``method`` and ``fused``)."""

from dualdrop.nn.methods.penalty import method as _moved

globals().update({k: v for k, v in vars(_moved).items() if not k.startswith("__")})
