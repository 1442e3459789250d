"""The Chainer venv holds Chainer 7.8.1 on NumPy 1.x and fastload's compiled core."""
import warnings
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # chainer 7.8.1 imports numpy.distutils (deprecated)
    import chainer
import numpy
import fastload
import fastload.compat.chainer
assert chainer.__version__ == "7.8.1", chainer.__version__
assert numpy.__version__.startswith("1."), numpy.__version__
assert fastload.backend == "c", fastload.backend
print("chainer", chainer.__version__, "numpy", numpy.__version__, "fastload", fastload.__version__)
