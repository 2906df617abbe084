"""Former module path of the vardrop family, kept so that imports and pickled models that name it still
resolve; the code lives in ``dualdrop.nn.methods.vardrop`` (``method`` and ``fused``)."""

from dualdrop.nn.methods.vardrop import method as _moved

globals().update({k: v for k, v in vars(_moved).items() if not k.startswith("__")})
