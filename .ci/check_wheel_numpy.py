"""The installed wheel (not a source tree) is what runs, with the NumPy the requirement names."""
import sys
import numpy, fastload
from packaging.requirements import Requirement
assert "site-packages" in fastload.__file__, fastload.__file__
assert Requirement(sys.argv[1]).specifier.contains(numpy.__version__), numpy.__version__
print("wheel", fastload.__file__, "with numpy", numpy.__version__)
